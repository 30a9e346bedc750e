"""The API's answers as types: one module per concept, each route's `response_model`.

The OpenAI- and Anthropic-compatible objects are the official SDKs' types with
quotaflow's few extra fields added (`queue`, retention), so the document says what the
SDKs parse. Field order follows the objects the domain builds (quotaflow.jobs.view,
quotaflow.compat.*), so an answer validated through its model is the same JSON as before.
"""
