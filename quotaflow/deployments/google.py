"""The checks a `gemini` or `vertex` deployment's table can fail (docs/deployments/google.md).

Kept apart from deployment.py, which every provider kind shares: a Gemini API deployment
authenticates with an API key and nothing else, a Vertex AI one with OAuth (a service
account or application default credentials) at a project and location that name its
URL, so a table mixing the two is refused before a call could go to the wrong place.
"""

GOOGLE_KINDS = frozenset({"gemini", "vertex"})


def check_google(provider: str, project: str | None, location: str | None,
                 api_key_env: str | None, credentials_file: str | None) -> None:
    """ValueError where the table cannot be called the way its kind is called."""
    if provider not in GOOGLE_KINDS:
        for name, value in (("project", project), ("location", location),
                            ("credentials_file", credentials_file)):
            if value is not None:
                raise ValueError(f"{name} is Vertex AI's; provider {provider!r} does not use it")
        return
    if provider == "gemini":
        if not api_key_env:
            raise ValueError("provider 'gemini' needs api_key_env: the variable holding the "
                             "Gemini API key (sent as x-goog-api-key)")
        for name, value in (("project", project), ("location", location),
                            ("credentials_file", credentials_file)):
            if value is not None:
                raise ValueError(f"{name} is Vertex AI's; use provider 'vertex' or leave it out")
        return
    if not project or not location:
        raise ValueError("provider 'vertex' needs project and location (e.g. location = "
                         "\"us-central1\"): they name its URL")
    if api_key_env:
        raise ValueError("provider 'vertex' authenticates with OAuth (credentials_file, or "
                         "application default credentials), not api_key_env")
