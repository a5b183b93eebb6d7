"""Compressed files under a source's globs: logrotate's ``compress`` leaves ``app.log.1.gz``
beside the log, and a glob such as ``app.log*`` matches it. Its bytes are not lines: shipped as
they are, every tier would count gzip fragments as events. A file whose first bytes are the
magic of gzip, zstd, xz or bzip2 is therefore never read as lines: it is skipped, logged once,
counted (``agent_source_bad_input_total{kind="compressed"}``) and listed in status
(``files_waiting.compressed``).
"""

from __future__ import annotations

MAYBE = "maybe"          # the first bytes so far are a prefix of a magic: look again with more
HEAD_BYTES = 16          # enough for every magic below

# (name, magic); ``None`` in a magic stands for one ASCII digit 1-9 (bzip2's block size).
_MAGICS: tuple[tuple[str, tuple[bytes | None, ...]], ...] = (
    ("gzip", (b"\x1f\x8b",)),
    ("zstd", (b"\x28\xb5\x2f\xfd",)),
    ("xz", (b"\xfd7zXZ\x00",)),
    ("bzip2", (b"BZh", None, b"1AY&SY")),
)


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
