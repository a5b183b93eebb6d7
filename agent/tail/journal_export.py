"""journalctl's export format (``--output=export``), cut into entries as it comes: the journald
source's reader.

An entry is its fields, one after another, and a blank line. A field is ``NAME=value`` and a
newline, or — when the value holds a control character or is not UTF-8 — its name and a
newline, the value's length as 8 bytes little-endian, the value and a newline. Fields come in
the entry's order, a field given twice twice. journalctl prints this form for about a quarter
of what its JSON costs it (5.3 against 19.1 CPU-µs an entry of ~25 fields, measured), and
nothing in it needs decoding: where the native extension is installed it cuts the entries
and makes the records (``docket_native.JournalExport``), and this module makes the ones it
leaves.
"""

from __future__ import annotations

# A binary field longer than this is not believed: journald keeps no field above 768 MiB
# (its DATA_SIZE_MAX); a length beyond it is a stream out of step, not a value to wait for.
MAX_FIELD_BYTES = 768 << 20


class ExportError(ValueError):
    """The stream is not in the export format (the reader starts journalctl again from the
    last cursor)."""


Entry = list[tuple[bytes, bytes]]


def cut(buf: bytes, start: int = 0) -> tuple[list[tuple[int, int, Entry]], int]:
    """The whole entries of ``buf`` from ``start`` on, each as (its first byte, the byte after
    its blank line, its fields as (name, value)); and where the first entry not yet whole
    begins (the caller keeps the bytes from there for the next read)."""
    out: list[tuple[int, int, Entry]] = []
    fields: Entry = []
    begin = pos = start
    n = len(buf)
    while pos < n:
        nl = buf.find(b"\n", pos)
        if nl < 0:
            break
        if nl == pos:                                   # the blank line: the entry is whole
            pos = nl + 1
            if fields:
                out.append((begin, pos, fields))
                fields = []
            begin = pos
            continue
        eq = buf.find(b"=", pos, nl)
        if eq >= 0:
            fields.append((buf[pos:eq], buf[eq + 1:nl]))
            pos = nl + 1
            continue
        at = nl + 1                                     # the binary form
        if at + 8 > n:
            break
        size = int.from_bytes(buf[at:at + 8], "little")
        if size > MAX_FIELD_BYTES:
            raise ExportError(f"a field {buf[pos:nl][:64]!r} of {size} bytes at byte {pos} "
                              "(not the export format)")
        end = at + 8 + size
        if end >= n:
            break
        if buf[end] != 0x0A:
            raise ExportError(f"the field {buf[pos:nl][:64]!r} at byte {pos} does not end "
                              "with a newline after its length (not the export format)")
        fields.append((buf[pos:nl], buf[at + 8:end]))
        pos = end + 1
    return out, begin


def fields_of(entry: Entry) -> dict[str, bytes | list[bytes]]:
    """An entry's fields by name in the order first seen, a field given more than once as the
    list of its values."""
    out: dict[str, bytes | list[bytes]] = {}
    for name, value in entry:
        key = name.decode("utf-8", "replace")
        had = out.get(key)
        if had is None:
            out[key] = value
        elif isinstance(had, list):
            had.append(value)
        else:
            out[key] = [had, value]
    return out
