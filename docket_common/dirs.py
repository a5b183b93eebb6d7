"""Where docket's local tools keep their state and their caches, per user."""

from __future__ import annotations

import os
from pathlib import Path


def docket_state_dir(name: str) -> Path:
    """``<user state folder>/docket/<name>``: where docket's local tools keep their state."""
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "docket" / name


def jar_cache_dir(override_var: str, name: str) -> Path:
    """``$override_var`` when set, else ``<user cache>/docket/<name>/libs``."""
    override = os.environ.get(override_var)
    if override:
        return Path(override)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "docket" / name / "libs"
