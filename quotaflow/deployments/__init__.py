"""Deployments: where a model can be called (a provider endpoint, model and key), its limits
and prices, and the file that lists them. The bottom floor: it imports nothing of quotaflow's
but errors and constants.
"""
