"""Compressed files under a source's globs: logrotate's ``compress`` leaves ``app.log.1.gz``
beside the log, and a glob such as ``app.log*`` matches it. Its bytes are not lines: shipped as
they are, every tier would count gzip fragments as events. A file whose first bytes are the
magic of gzip, zstd, xz or bzip2 is read as what it decompresses to (``Decompressed``, through
``seams.FsOps``): as the compressed form of a generation being read it is read on from where
reading stopped, else it is skipped (logged once, counted as
``agent_source_bad_input_total{kind="compressed"}`` and listed in status as
``files_waiting.compressed``) or read whole (``compressed = "read"``). zstd through the
``zstandard`` package (Python's standard library has no zstd before 3.14).
"""

from __future__ import annotations

import bz2
import lzma
import os
import zlib

import zstandard

MAYBE = "maybe"          # the first bytes so far are a prefix of a magic: look again with more
HEAD_BYTES = 16          # enough for every magic below

# (name, magic); ``None`` in a magic stands for one ASCII digit 1-9 (bzip2's block size).
_MAGICS: tuple[tuple[str, tuple[bytes | None, ...]], ...] = (
    ("gzip", (b"\x1f\x8b",)),
    ("zstd", (b"\x28\xb5\x2f\xfd",)),
    ("xz", (b"\xfd7zXZ\x00",)),
    ("bzip2", (b"BZh", None, b"1AY&SY")),
)


# The names compressors give their output (gzip, xz, bzip2, zstd).
SUFFIXES = (".gz", ".xz", ".bz2", ".zst")


def named(path: str) -> bool:
    """Whether ``path`` ends as a compressor's output is named (an empty file so named is
    most likely one a compressor has only just made)."""
    return path.endswith(SUFFIXES)


def _matches(head: bytes, parts: tuple[bytes | None, ...]) -> str | None:
    """``"yes"``, ``MAYBE`` (``head`` ends inside the magic) or None."""
    at = 0
    for part in parts:
        want = 1 if part is None else len(part)
        got = head[at:at + want]
        if part is None:
            ok = got == b"" or (len(got) == 1 and 0x31 <= got[0] <= 0x39)
        else:
            ok = part.startswith(got)
        if not ok:
            return None
        if len(got) < want:
            return MAYBE
        at += want
    return "yes"


def kind(head: bytes) -> str | None:
    """The compression the first bytes ``head`` of a file announce (``gzip``, ``zstd``,
    ``xz``, ``bzip2``), ``MAYBE`` when ``head`` is too short to tell, or None."""
    maybe = False
    for name, parts in _MAGICS:
        found = _matches(head, parts)
        if found == "yes":
            return name
        maybe |= found == MAYBE
    return MAYBE if maybe and head != b"" else None


# -- reading a compressed file as its decompressed bytes ----------------------------------------
READABLE = ("gzip", "zstd", "xz", "bzip2")
CHUNK_IN = 64 << 10           # compressed bytes fed to a decompressor at a time
HEAD_KEPT = 64 << 10          # the first decompressed bytes, kept (looked at after every read)
BEHIND_KEPT = 256 << 10       # decompressed bytes kept behind the last read (small looks back)


def _decompressor(kind: str):
    if kind == "gzip":
        return zlib.decompressobj(31)
    if kind == "xz":
        return lzma.LZMADecompressor(lzma.FORMAT_XZ)
    if kind == "zstd":                # one frame a decompressor, as a gzip member
        return zstandard.ZstdDecompressor().decompressobj()
    return bz2.BZ2Decompressor()


class _Stream:
    """One pass of decompression over the file behind ``fd``, from its start: each call of
    ``more`` decompresses the next compressed bytes the file holds. Concatenated members or
    streams (``cat a.gz b.gz``) follow each other; a corrupt stream ends where it breaks."""

    def __init__(self, fd: int, kind: str):
        self.fd, self.kind = fd, kind
        self.d = _decompressor(kind)
        self.in_pos = 0               # compressed bytes consumed
        self.out_pos = 0              # decompressed bytes produced
        self.broken: str | None = None
        self.ended = False            # the bytes consumed end with a whole stream

    def more(self) -> bytes:
        """The next decompressed bytes (b"" when the file holds no more for now)."""
        if self.broken:
            return b""
        data = os.pread(self.fd, CHUNK_IN, self.in_pos)
        if not data:
            return b""
        self.in_pos += len(data)
        out = []
        try:
            while data:
                out.append(self.d.decompress(data))
                self.ended = self.d.eof
                if not self.d.eof:
                    break
                data = self.d.unused_data        # the next member or stream
                self.ended = not data
                if data and kind(data[:HEAD_BYTES]) not in (self.kind, MAYBE):
                    self.broken = "trailing bytes that are not another compressed stream"
                    break
                self.d = _decompressor(self.kind)
        except (zlib.error, lzma.LZMAError, zstandard.ZstdError, OSError, EOFError) as exc:
            self.broken = str(exc) or type(exc).__name__
        chunk = b"".join(out)
        self.out_pos += len(chunk)
        return chunk


class Decompressed:
    """A gzip, zstd, xz or bzip2 file seen as its decompressed bytes, for the file source's reads
    (``FsOps``): ``size`` is what its compressed bytes decompress to so far (a file still being
    written grows, as any file does), ``pread`` any range of it. Reads go forward through one
    stream, keeping the head and the last ``BEHIND_KEPT`` bytes; a read further back starts a
    new pass. A second pass runs ahead for the size, so a size look never moves the reader."""

    def __init__(self, fd: int, kind_: str):
        self.fd, self.kind = fd, kind_
        self.head = b""
        self._sizer = _Stream(fd, kind_)
        self._reader: _Stream | None = None
        self._window = b""
        self._window_at = 0

    def size(self) -> int:
        while os.fstat(self.fd).st_size > self._sizer.in_pos and not self._sizer.broken:
            chunk = self._sizer.more()
            if len(self.head) < HEAD_KEPT and chunk:
                self.head = (self.head + chunk)[:HEAD_KEPT]
        return self._sizer.out_pos

    def whole(self) -> bool:
        """Whether the file's bytes so far end with a whole compressed stream (or cannot be
        decompressed further): false while a compressor is still writing it (logrotate's
        ``compress`` writes ``app.log.1.gz`` for as long as gzip takes)."""
        self.size()
        return self._sizer.ended or self._sizer.broken is not None

    def pread(self, n: int, offset: int) -> bytes:
        end = offset + n
        if end <= len(self.head):
            return self.head[offset:end]
        r = self._reader
        if r is None or offset < self._window_at:
            r = self._reader = _Stream(self.fd, self.kind)
            self._window, self._window_at = b"", 0
        parts, start = [self._window], self._window_at       # the window ends at r.out_pos
        have = start + len(self._window)
        while have < end:
            chunk = r.more()
            if not chunk:
                if r.broken or r.in_pos >= os.fstat(self.fd).st_size:
                    break
                continue
            parts.append(chunk)
            have += len(chunk)
            if have - start > 4 * BEHIND_KEPT + n:            # passing by: keep memory bounded
                joined = b"".join(parts)
                cut = max(0, min(offset, have) - BEHIND_KEPT - start)
                parts, start = [joined[cut:]], start + cut
        window = b"".join(parts)
        keep_from = max(start, offset - BEHIND_KEPT)
        self._window, self._window_at = window[keep_from - start:], keep_from
        return self._window[offset - keep_from:end - keep_from]
