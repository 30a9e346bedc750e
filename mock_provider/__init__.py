"""A simulated OpenAI-compatible provider: the judge of quotaflow's limiter, and the
cheap stand-in of its throughput benchmarks.

It is a product of its own, apart from the REST API (api/): quotaflow's workers
talk to it over HTTP exactly as to OpenAI, and it takes from quotaflow what
describes a provider (its endpoints, how it counts tokens, what a simulated
answer says), never the limiter it judges. Two servers, one settings object:

- strict (the default): admits a request only if its RPM and TPM buckets both
  hold enough, answers 429s with OpenAI's headers and bodies otherwise, injects
  faults on demand, and tells tests through GET /stats what it admitted;
- unlimited: admits everything at the least CPU per request, for benchmarks
  where it shares the machine with what it measures.

Serve either from one process (`quotaflow mock-provider`): the strict one keeps
its buckets in memory.
"""

from mock_provider.app import app_from_env, build_app
from mock_provider.lean import LeanProvider
from mock_provider.settings import MockProviderSettings
from mock_provider.strict import create_app

__all__ = ["LeanProvider", "MockProviderSettings", "app_from_env", "build_app", "create_app"]
