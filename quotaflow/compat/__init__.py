"""The providers' compatible APIs over quotaflow's jobs: OpenAI's Files and Batch APIs,
Anthropic's Message Batches API, and the end of a job's data (deletion and retention).
"""
