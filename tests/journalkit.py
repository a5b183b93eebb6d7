"""Journal files for the journald source's tests: written by systemd-journal-remote from
export-format input (no running journald needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

REMOTE = Path("/lib/systemd/systemd-journal-remote")
BOOT = "0123456789abcdef0123456789abcdef"
T0 = 1_790_000_000_000_000                       # µs


def export(entries: list[dict]) -> bytes:
    """Journal export format: FIELD=value lines, a blank line after each entry; a value
    holding a newline (or not UTF-8) in the binary form."""
    out = bytearray()
    for e in entries:
        for k, v in e.items():
            v = v if isinstance(v, bytes) else str(v).encode()
            if b"\n" in v or not _utf8(v):
                out += k.encode() + b"\n" + len(v).to_bytes(8, "little") + v + b"\n"
            else:
                out += k.encode() + b"=" + v + b"\n"
        out += b"\n"
    return bytes(out)


def _utf8(v: bytes) -> bool:
    try:
        v.decode()
        return True
    except UnicodeDecodeError:
        return False


def entry(i: int, **fields) -> dict:
    return {"__REALTIME_TIMESTAMP": T0 + i * 1000, "__MONOTONIC_TIMESTAMP": i + 1,
            "_BOOT_ID": BOOT, "MESSAGE": f"event {i}", "SYSLOG_IDENTIFIER": "app",
            "PRIORITY": 6, "_SYSTEMD_UNIT": "app.service", **fields}


def write_journal(path: Path, entries: list[dict]) -> None:
    """Append ``entries`` to the journal file ``path`` (made when absent)."""
    subprocess.run([str(REMOTE), "-o", str(path), "-"], input=export(entries), check=True,
                   capture_output=True)




def journal_tools() -> bool:
    return REMOTE.exists() and shutil.which("journalctl") is not None
