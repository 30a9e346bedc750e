"""quotaflow's REST API (FastAPI): jobs, files and the OpenAI-compatible Batch API."""
