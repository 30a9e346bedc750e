"""quotaflow's HTTP side: the REST API and the mock provider."""
