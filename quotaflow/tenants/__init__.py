"""Tenants: the API keys that act for them, their quota of enqueued tokens, and what they spend.
"""
