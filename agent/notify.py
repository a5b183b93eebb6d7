"""systemd's notify protocol, spoken over ``$NOTIFY_SOCKET`` (a no-op when it is not set)."""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self):
        addr = os.environ.get("NOTIFY_SOCKET")
        self.addr = ("\0" + addr[1:]) if addr and addr.startswith("@") else addr
        usec = os.environ.get("WATCHDOG_USEC")
        self.watchdog_interval_s = int(usec) / 2e6 if usec and usec.isdigit() else None

    def send(self, *fields: str) -> None:
        if not self.addr:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            try:
                # Never block the agent's loop on a listener that does not read.
                s.sendto("\n".join(fields).encode(), socket.MSG_DONTWAIT, self.addr)
            except OSError:
                pass           # systemd gone or its queue full: nothing to tell

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def reloading(self) -> None:
        """Before a reload; ``ready`` follows it (systemd's Type=notify reload protocol)."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")
