"""The folder a glob pattern lives in: what the configuration checks and the folder watch
watches. Apart from ``agent.tail`` so that the configuration needs no watchdog."""

from __future__ import annotations

import glob
from pathlib import Path


def glob_folder(pattern: str) -> Path:
    """The last folder of ``pattern`` free of wildcards."""
    folder = Path(pattern).parent
    while glob.has_magic(str(folder)):
        folder = folder.parent
    return folder
