"""Journals for the journald source's tests: files written by systemd-journal-remote from
export-format input (no running journald needed), and a real systemd-journald of a test's own
in a private mount namespace (``Journald``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
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


class Journald:
    """A systemd-journald of the test's own, in a private mount namespace: a tmpfs over /run
    (its journal volatile under /run/log/journal), its own journald.conf (no rate limit, small
    files so that rotation and vacuuming come quickly), nothing of the host's touched. Other
    processes join the namespace through ``prefix`` (nsenter) to write to it or read it."""

    def __init__(self, folder: Path, max_file_bytes: int = 1 << 20):
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "journald.conf"
        conf.write_text(f"[Journal]\nStorage=volatile\nRateLimitBurst=0\n"
                        f"RuntimeMaxFileSize={max_file_bytes}\n")
        script = ("mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/journal /run/log && "
                  f"mount --bind {conf} /etc/systemd/journald.conf && "
                  "exec /lib/systemd/systemd-journald")
        self.log = open(folder / "journald.log", "wb")
        self.proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                      script], stdout=self.log, stderr=self.log)
        self.prefix = ["nsenter", "-t", str(self.proc.pid), "-m", "--"]
        deadline = time.monotonic() + 30
        while self.run(["test", "-S", "/run/systemd/journal/socket"], check=False).returncode:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("journald did not start: "
                                     + (folder / "journald.log").read_text())
            time.sleep(0.05)

    def run(self, args: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
        """``args`` run in the journal's namespace."""
        return subprocess.run([*self.prefix, *args], check=check, capture_output=True,
                              timeout=60, **kw)

    def log_lines(self, identifier: str, lines: list[str], written: bool = False) -> None:
        """``lines`` written to the journal by ``systemd-cat`` (a stdout stream), one entry
        each. ``systemd-cat`` ends once it has handed them to journald's stream, which journald
        reads when it comes to it: ``written`` waits (up to 60 s) until the journal's files
        hold the last of them (a rotation asked for before then finds them not yet written and
        they go to the new file: a loaded host once did that)."""
        self.run(["systemd-cat", "-t", identifier], input="".join(f"{x}\n" for x in lines)
                 .encode())
        if not written or not lines:
            return
        deadline = time.monotonic() + 60
        while not any(e.get("MESSAGE") == lines[-1] for e in self.entries("-t", identifier)):
            if time.monotonic() > deadline:
                raise AssertionError(f"journald has not written {lines[-1]!r} after 60 s")
            time.sleep(0.05)

    def entries(self, *args: str) -> list[dict]:
        out = self.run(["journalctl", "-o", "json", "--no-pager", *args]).stdout
        return [json.loads(line) for line in out.splitlines()]

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def namespaces_work() -> bool:
    """Whether a journald of a test's own can run here (root, unshare and nsenter)."""
    return journal_tools() and os.geteuid() == 0 and shutil.which("unshare") is not None \
        and shutil.which("nsenter") is not None and Path("/lib/systemd/systemd-journald").exists()
