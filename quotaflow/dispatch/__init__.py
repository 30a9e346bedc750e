"""Dispatch: the queue contract (a message names a batch, never its prompts), which queue a
batch goes to, in which order a job's batches leave, and the reaper that queues again what no
worker will otherwise pick up.
"""
