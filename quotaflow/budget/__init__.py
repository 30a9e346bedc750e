"""The budget: each deployment's RPM/TPM buckets in Redis (the limiter), its circuit breaker,
the fair shares between tenants, which deployment of a route takes the next requests, and the
token counts admission pays with.
"""
