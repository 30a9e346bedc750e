"""Settings renamed so that every duration in seconds ends in `_s`; the old names still work.

A deployment that sets `QUOTAFLOW_LEASE_SECONDS` (or passes `lease_seconds=` to
Settings) keeps working across the rename, told once per process to move to the new
name. The new name wins where both are set.
"""

import os
import warnings
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

PREFIX = "QUOTAFLOW_"
RENAMED = {"lease_seconds": "lease_s", "visibility_timeout": "visibility_timeout_s",
           "task_time_limit": "task_time_limit_s"}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is now {new}; the old name will stop being read in a later "
                  "release", FutureWarning, stacklevel=4)


def rename_arguments(data: Any) -> Any:
    """Keyword arguments under a former name, under the new one."""
    if not isinstance(data, dict):
        return data
    for old, new in RENAMED.items():
        if old in data:
            _warn(old, new)
            value = data.pop(old)
            data.setdefault(new, value)
    return data


class RenamedEnvironment(PydanticBaseSettingsSource):
    """QUOTAFLOW_* variables under a setting's former name, below the current names."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the whole environment at once

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for old, new in RENAMED.items():
            value = os.environ.get(PREFIX + old.upper())
            if value is not None:
                _warn(PREFIX + old.upper(), PREFIX + new.upper())
                found[new] = value
        return found
