"""Results: an item's way through a worker (claimed under a lease, given back, or closed with
its result), answers reused across jobs, and the output and error lines in input order.
"""
