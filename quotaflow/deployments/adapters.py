"""The checks a `local` deployment's LoRA adapters can fail, and the models it serves.

A local deployment may name LoRA adapters (name -> a directory written by peft's
`save_pretrained`); a line's `model` picks one, as it does on vLLM's own server, and a
line whose model is the deployment's `model` runs on the base weights. So the adapters'
names are models too: routes find the deployment by them (catalog.py). The paths are
not read here: the file may be read on a host without the model (the API); the worker
that loads it refuses a missing one (quotaflow/providers/local/adapters.py).
"""

from collections.abc import Mapping

# What an adapter's name may hold: it travels as a line's `model` and in log lines.
NAME_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                            "-_.:/@")


def check_adapters(provider: str, model: str, adapters: Mapping[str, str]) -> None:
    """ValueError where an adapter could not be told apart or found: a name that is the
    base model's, odd characters, an empty path, or adapters on a kind that runs none."""
    if not adapters:
        return
    if provider != "local":
        raise ValueError(f"adapters are LoRA adapters of a local model; provider {provider!r} "
                         "serves its adapters under model names of its own: route those")
    for name, path in adapters.items():
        if not name or not set(name) <= NAME_CHARACTERS:
            raise ValueError(f"adapters: {name!r} is not a model name (letters, digits and "
                             "- _ . : / @)")
        if name == model:
            raise ValueError(f"adapters: {name!r} is the deployment's model, which names the "
                             "base weights; give the adapter a name of its own")
        if not path.strip():
            raise ValueError(f"adapters: {name!r} has no path (a directory written by peft's "
                             "save_pretrained)")


def served_models(model: str, adapters: Mapping[str, str]) -> tuple[str, ...]:
    """The models a deployment answers: its own (the base weights), then its adapters'."""
    return (model, *adapters)
