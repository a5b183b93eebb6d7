"""What ends the agent loop's sleep when it has nothing to do.

An idle loop (nothing filling, nothing sealed, nothing on its way to Kafka) sleeps until its
next duty — a scan, the gauges, the watchdog — up to a second, on one descriptor: an epoll
instance that becomes readable when a tailed folder's write watch does (``FolderWatch``) or
when this module's pipe gets a byte. The pipe is written by ``notify`` (``Agent.stop`` from
another thread) and by Python's signal handling (``signal.set_wakeup_fd``: a SIGTERM or a
SIGHUP ends the sleep at once, whichever thread the kernel gave it to). So a quiet host's agent
wakes a few times a second, not every 50 ms, and still answers a write, a new file, a stop or
a reload at once.
"""

from __future__ import annotations

import errno
import os
import select


class LoopWake:
    def __init__(self):
        self._read, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll = select.epoll()
        self._epoll.register(self._read, select.EPOLLIN)
        self._watch = None          # the write watch registered, and its descriptor
        self._watch_fd = -1

    def fd(self, watch) -> int:
        """The descriptor to sleep on, with ``watch`` (a ``FolderWatch``'s ``WriteWatch`` or
        None) registered in place of the one before: a watch built again (a reload) may reuse
        the old one's number, so the object decides, not the number."""
        if watch is not self._watch or (watch is not None and watch.fd != self._watch_fd):
            old = self._watch
            if old is not None and old.fd >= 0 and old.fd == self._watch_fd:
                try:                      # still open: it may be used again
                    self._epoll.unregister(self._watch_fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.EBADF):
                        raise
            # A watch closed took its registration with it, and its number may belong to
            # any file now (a regular file's refuses epoll with EPERM): it is not asked.
            self._watch, self._watch_fd = watch, -1
            if watch is not None and watch.fd >= 0:
                self._epoll.register(watch.fd, select.EPOLLIN)
                self._watch_fd = watch.fd
        return self._epoll.fileno()

    def notify(self) -> None:
        """End the current or the next sleep."""
        try:
            os.write(self.write_fd, b"\0")
        except BlockingIOError:
            pass                          # full: a byte waits already

    def clear(self) -> None:
        """Empty the pipe (each turn, before the loop may sleep again)."""
        while True:
            try:
                if not os.read(self._read, 4096):
                    return
            except BlockingIOError:
                return
            except InterruptedError:
                continue

    def close(self) -> None:
        if self._read < 0:
            return
        self._epoll.close()
        for fd in (self._read, self.write_fd):
            os.close(fd)
        self._read = self.write_fd = -1
