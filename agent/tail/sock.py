"""The socket source: a unix stream socket accepting newline-delimited events.

Each connection is read by its own thread. When the pool has no free slot the thread waits
before reading more, so the kernel's socket buffer fills and the client's writes block:
backpressure, not loss. Socket data cannot be re-read, so records still in a filling slot when
the agent is killed are lost (at most ``linger_ms`` of them); a graceful stop seals them first,
with what each connection's kernel buffer still holds and a line its sender left unended.
Each append wakes the agent's loop (``on_data``: ``agent/wake.py``), which may be asleep for up
to a second with nothing to send.
"""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import socket
import struct
import termios
import threading

from ..buffer import BufferPool, Chunk
from ..buffer.seams import Clock
from ..config import SourceConfig
from ..telemetry import Metrics
from .lines import LineCutter

log = logging.getLogger("docket.agent.socket")
READ_BYTES = 256 * 1024


class SocketSource:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, metrics: Metrics,
                 clock: Clock | None = None, on_data=None, journal=None):
        self.cfg = cfg
        self._on_data = on_data or (lambda: None)   # records appended: wake the agent's loop
        self.clock = clock or Clock()
        self.metrics = metrics
        self.lines = LineCutter(cfg, metrics)
        self._stop = threading.Event()
        self.feed = PoolFeed(cfg.topic, pool, metrics, self._on_data, self._stop, journal)
        self._threads: list[threading.Thread] = []
        if os.path.exists(cfg.path):
            os.unlink(cfg.path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(cfg.path)
        # Writers connect by group (the agent's UMask would leave the group read-only): the
        # agent's own, or the source's `group`.
        if cfg.group is not None:
            os.chown(cfg.path, -1, grp.getgrnam(cfg.group).gr_gid)
        os.chmod(cfg.path, 0o660)
        self.server.listen(64)
        self.server.settimeout(0.2)
        self._accept = threading.Thread(target=self._accept_loop, name="docket-socket",
                                        daemon=True)
        self._accept.start()

    def _accept_loop(self) -> None:
        accept_each(self.server, self._stop, self._threads, "docket-socket-conn",
                    lambda conn, _addr: self._serve(conn))

    def _serve(self, conn: socket.socket) -> None:
        pending = b""
        conn.settimeout(0.2)
        with conn:
            for data in reads(conn, self._stop):
                pending = self._whole_lines(pending + data)
            if self._stop.is_set():           # stopping: what the kernel still holds goes too
                pending = self._whole_lines(pending + left_in(conn))
            if pending:                       # the sender closed, or the agent stops, mid-line
                self._append(self.lines.force(pending, "partial_line_flushed"))

    def _whole_lines(self, data: bytes) -> bytes:
        """Append the whole lines of ``data``; returns what follows the last of them."""
        whole, rest = self.lines.split_stream(data)
        if whole is not None:
            self._append(whole)
        return rest

    def _append(self, data: bytes) -> None:
        self.feed.append(self.lines.frame(data, len(data), self.clock.time_ms()), len(data))

    def describe(self) -> dict:
        """For ``/status``: the socket's path and its open connections."""
        return {"source": self.cfg.index, "type": "socket", "path": self.cfg.path,
                "topic": self.cfg.topic,
                "connections": sum(1 for t in self._threads if t.is_alive())}

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: stop reading, appending nothing more (a killed
        agent's threads end where they are; what they had read dies with them)."""
        self.feed.abandoned = True
        self.close()

    def close(self) -> None:
        """Stop listening: each connection's whole lines, what its kernel buffer still holds
        and a line left unended are appended first (the pool's room allowing: ``PoolFeed``)."""
        self._stop.set()
        self.server.close()
        self._accept.join(timeout=2)          # a connection it accepted is in the list first
        for t in self._threads:
            t.join(timeout=2)
        if os.path.exists(self.cfg.path):
            os.unlink(self.cfg.path)


def accept_each(server: socket.socket, stopped: threading.Event,
                threads: list[threading.Thread], name: str, serve) -> None:
    """Accept connections on ``server`` (its timeout set) until ``stopped`` or it is closed,
    each served by ``serve(conn, addr)`` on a thread of its own, kept in ``threads`` (those
    that ended dropped from it)."""
    while not stopped.is_set():
        try:
            conn, addr = server.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        t = threading.Thread(target=serve, args=(conn, addr), daemon=True, name=name)
        t.start()
        threads[:] = [x for x in threads if x.is_alive()] + [t]


def left_in(conn: socket.socket) -> bytes:
    """What the kernel holds unread for ``conn`` now, read without waiting: no more than it
    held when asked (and a read's worth more, for what TLS holds decrypted), so a sender that
    goes on writing does not hold a stopping agent."""
    out, taken = [], 0
    try:
        queued = struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        conn.settimeout(0)
        while taken < queued + READ_BYTES and (data := conn.recv(READ_BYTES)):
            out.append(data)
            taken += len(data)
    except OSError:                           # nothing more now (or the connection failed)
        pass
    return b"".join(out)


def reads(conn: socket.socket, stopped: threading.Event, peek: bool = True):
    """What ``conn`` (its timeout set) sends, read by read, until it closes, fails (a TLS error
    too) or ``stopped``. ``peek`` (not for TLS): a read is taken from the kernel only when the
    caller asks for the next one — after it appended the read's whole records — so a crash
    between the read and the append leaves them with the connection, not in a dead process
    (what a connection's kernel buffer holds dies with it either way)."""
    sink = bytearray(READ_BYTES) if peek else None
    while not stopped.is_set():
        try:
            data = conn.recv(READ_BYTES, socket.MSG_PEEK) if peek else conn.recv(READ_BYTES)
        except TimeoutError:
            continue
        except OSError:
            return
        if not data:
            return
        yield data
        if peek:
            taken = 0
            try:
                while taken < len(data):
                    got = conn.recv_into(memoryview(sink)[:len(data) - taken])
                    if not got:
                        return
                    taken += got
            except OSError:
                return


class PoolFeed:
    """A listening source's way into the pool: a chunk appended whole, waiting while the pool is
    full (the caller's thread, and so its socket, is not read meanwhile: backpressure), each
    append waking the agent's loop. Once the source stops it waits no more: what the pool then
    has no room for is journalled (``listener_stopped``), never dropped unsaid."""

    def __init__(self, topic: str, pool: BufferPool, metrics: Metrics, on_data,
                 stopped: threading.Event, journal=None):
        self.topic = topic
        self.pool = pool
        self.metrics = metrics
        self.on_data = on_data
        self.stopped = stopped
        self.journal = journal
        self.abandoned = False                # a simulated SIGKILL: nothing is appended

    def append(self, chunk: Chunk, nbytes: int, topic: str | None = None) -> int:
        """Append ``chunk`` (``nbytes`` read for it) to ``topic`` (default: the source's);
        returns the records appended (fewer only when the source stopped with the pool full)."""
        topic = topic or self.topic
        done = parts = 0
        while done < len(chunk):
            if self.abandoned:                # a simulated SIGKILL while this waited for room
                return done
            stopping = self.stopped.is_set()
            rest = chunk if done == 0 else _tail(chunk, done)
            # Waits for room (backpressure); once: what a crash finds not yet sealed is kept.
            # A record longer than a slot cut short goes on from its first part not sealed.
            res = self.pool.append(topic, rest, timeout_s=0.0 if stopping else 0.5, once=True,
                                   parts_done=parts)
            done += res.records
            parts = res.parts
            self.metrics.inc("agent_source_read_events_total", res.records - res.dropped,
                             topic=topic)
            self.on_data()
            if stopping and done < len(chunk) and not self.abandoned:
                left = len(chunk) - done
                log.error("%d event(s) of topic %s read from a listener as it stopped found the "
                          "pool full: not kept", left, topic)
                if self.journal is not None:
                    self.journal.record("listener_stopped", topic, left, detail="events read "
                                        "from a listening source as it stopped, the pool full")
                break
        self.metrics.inc("agent_source_read_bytes_total", nbytes, topic=topic)
        return done


def _tail(chunk: Chunk, k: int) -> Chunk:
    keys = chunk.keys[k:] if chunk.keys is not None else None
    return Chunk(chunk.data, chunk.starts[k:], chunk.lengths[k:], chunk.timestamps[k:], keys,
                 chunk.end)
