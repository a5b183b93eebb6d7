"""Finding files: the globs' regular files by identity, and inodes that left the globs while the
agent was stopped.

A directory listing taken while files are renamed may miss a file for one scan (POSIX leaves it
unspecified whether an entry renamed during ``readdir`` is returned); nothing here depends on
one listing being complete: a file missing once and found again resumes from its checkpoint.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from collections.abc import Callable, Iterable

from ..globs import glob_folder
from .seams import FsOps

Ident = tuple[int, int]          # (device, inode)


def excluded(path: str, exclude: Iterable[str]) -> bool:
    """Whether ``path`` matches one of ``exclude``: a pattern without ``/`` against the file's
    name, one with ``/`` against the whole path (``fnmatch``: ``*`` also matches ``/``)."""
    name = os.path.basename(path)
    return any(fnmatch.fnmatchcase(path if "/" in p else name, p) for p in exclude)


def list_files(fs: FsOps, patterns: Iterable[str], not_regular: Callable[[str], None],
               exclude: Iterable[str] = ()) -> dict[Ident, tuple[str, os.stat_result]]:
    """Every regular file the globs match and ``exclude`` does not, once per identity (the
    first path found wins)."""
    found: dict[Ident, tuple[str, os.stat_result]] = {}
    exclude = tuple(exclude)
    for pattern in patterns:
        for path in fs.glob(pattern):
            if exclude and excluded(path, exclude):
                continue
            try:
                st = fs.stat(path)
            except OSError:
                continue                        # vanished between the listing and the stat
            if not stat.S_ISREG(st.st_mode):
                not_regular(path)
                continue
            found.setdefault((st.st_dev, st.st_ino), (path, st))
    return found


def find_outside(fs: FsOps, patterns: Iterable[str],
                 idents: set[Ident]) -> dict[Ident, tuple[str, os.stat_result]]:
    """Where the given inodes are now, if they are still in a glob's folder under a name the
    glob does not match (renamed by a rotation while the agent was stopped)."""
    hits: dict[Ident, tuple[str, os.stat_result]] = {}
    if not idents:
        return hits
    for folder in sorted({str(glob_folder(p)) for p in patterns}):
        for path in fs.listdir(folder):
            try:
                st = fs.stat(path)
            except OSError:
                continue
            ident = (st.st_dev, st.st_ino)
            if ident in idents and stat.S_ISREG(st.st_mode):
                hits.setdefault(ident, (path, st))
    return hits
