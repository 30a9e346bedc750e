"""quotaflow: batch LLM processing on one exact, cluster-wide provider budget."""

__version__ = "0.1.0"
