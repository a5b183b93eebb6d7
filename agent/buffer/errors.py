"""Named failures of the buffer pool; the edges (CLI, status) format them for people."""

from docket_common.errors import DocketError


class PoolError(DocketError):
    """Base class for buffer pool failures."""


class PoolFormatError(PoolError):
    """The file is not a docket buffer pool, or one of an unknown format version."""


class PoolDamaged(PoolFormatError):
    """The file was a docket buffer pool and is damaged: cut short, or its header fails its
    CRC. The agent moves it aside and starts a new pool (``agent/state/folder.py``)."""


class PoolGeometryMismatch(PoolError):
    """An existing pool was opened with another slot size or slot count."""


class PoolDiskTooSmall(PoolError):
    """The file system cannot hold the pool's preallocated size."""


class PoolCorrupt(PoolError):
    """A slot failed its checks while being read outside recovery."""


class PoolBusy(PoolError):
    """Another process, or another open BufferPool in this one, holds the pool file's lock."""
