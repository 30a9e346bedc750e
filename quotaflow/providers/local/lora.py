"""LoRA adapters on the transformers engine, through peft: loaded once, one per batch.

peft injects each adapter's low-rank weights into the model's own layers, so the
engine keeps calling the model it loaded; which adapter those layers apply is
switched per model batch (the batcher groups a batch by adapter: requests.py's
batch_kind), and a batch of base-model lines runs with the adapters turned off.
Switching only happens on the batcher's one thread. peft is imported only when a
deployment names adapters; without it their lines could not be answered honestly,
so the engine refuses to load and says what to install.
"""

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError
from quotaflow.providers.local.adapters import adapter_dirs


class LoraAdapters:
    """A deployment's adapters, loaded into `model` under their names."""

    def __init__(self, model: Any, deployment: Deployment) -> None:
        dirs = adapter_dirs(deployment)
        try:
            from peft import PeftModel
        except ImportError as exc:
            raise ConfigError(
                f"deployment {deployment.name!r} names LoRA adapters, which the transformers "
                "engine runs with peft, not installed here; pip install 'quotaflow[local]' "
                "(or pip install peft)") from exc
        (first, path), *rest = dirs.items()
        try:
            with warnings.catch_warnings():
                # peft asks transformers 5 for a property it deprecated: nothing to act on.
                warnings.filterwarnings("ignore", category=FutureWarning,
                                        message=".*is_gradient_checkpointing")
                self._peft = PeftModel.from_pretrained(model, str(path), adapter_name=first)
                for name, where in rest:
                    self._peft.load_adapter(str(where), adapter_name=name)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"deployment {deployment.name!r}: peft could not load its "
                              f"adapters onto {deployment.model_path} ({exc}); each must be "
                              "a LoRA adapter trained on that model") from exc
        self._peft.eval()
        self.names = tuple(dirs)

    @contextmanager
    def use(self, adapter: str | None) -> Iterator[None]:
        """Run the model with that adapter (None: the base weights) inside the block."""
        if adapter is None:
            with self._peft.disable_adapter():
                yield
            return
        self._peft.set_adapter(adapter)
        yield
