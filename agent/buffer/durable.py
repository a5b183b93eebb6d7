"""Names that survive a power loss. A file's ``fsync`` makes its content durable, not its name:
a file created, renamed or a folder made is durable only once the folder holding the name is
synced too (POSIX leaves it to the file system; ext4 and XFS keep the rule). The agent's state
folder is made, and its files created or moved, through these.
"""

from __future__ import annotations

import os
from pathlib import Path


def sync_folder(folder: Path) -> None:
    """``fsync`` a folder: the names created, renamed or removed in it are durable."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folder(folder: Path) -> None:
    """``mkdir -p``, each folder it makes synced into the one above it."""
    missing = []
    at = Path(folder)
    while not at.exists():
        missing.append(at)
        at = at.parent
    Path(folder).mkdir(parents=True, exist_ok=True)
    for made in reversed(missing):
        sync_folder(made.parent)


def open_created(path: Path, flags: int, mode: int) -> int:
    """``os.open`` with ``O_CREAT``; a file it creates is synced, then its name."""
    existed = path.exists()
    fd = os.open(path, flags | os.O_CREAT, mode)
    if not existed:
        try:
            os.fsync(fd)
            sync_folder(path.parent)
        except BaseException:
            os.close(fd)
            raise
    return fd


def moved(source: Path, target: Path) -> None:
    """``os.replace``, then both folders synced (the name gone from one, made in the other)."""
    os.replace(source, target)
    sync_folder(target.parent)
    if source.parent != target.parent:
        sync_folder(source.parent)
