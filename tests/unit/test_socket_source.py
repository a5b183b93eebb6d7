"""The unix socket source on a real socket and a real pool: what it read survives a crash
though no slot holding it was sealed (a writer cannot be asked again); a line the writer left
unended at the crash is not made a record, even when the writer closes after the crash; a
graceful stop appends such a line."""

from __future__ import annotations

import socket
import threading
import time

from agent.buffer import BufferPool
from agent.config import SourceConfig
from agent.tail.sock import SocketSource
from agent.telemetry import Metrics


def _pool(tmp_path) -> BufferPool:
    return BufferPool(tmp_path / "pool", 16 << 20, 1 << 20, linger_ms=1e9, sync_on_seal=False)


def _wait_appended(pool: BufferPool, n: int) -> None:
    deadline = time.monotonic() + 10
    while pool.stats()["records_appended"] < n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stats()["records_appended"] == n


def test_lines_read_from_the_socket_survive_a_crash_before_their_slot_is_sealed(tmp_path):
    """The writer closes only after the crash, with a line unended: its end of file reaches a
    source that is dead and appends nothing (once, under load, a source still running after the
    simulated crash made that fragment a record: the writer's close raced the source's stop)."""
    pool = _pool(tmp_path)
    cfg = SourceConfig(index=0, type="socket", topic="t", path=str(tmp_path / "in.sock"))
    src = SocketSource(cfg, pool, Metrics())
    try:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(cfg.path)
        client.sendall(b"".join(b"id-%06d hello\n" % i for i in range(500)) + b"id-0005")
        _wait_appended(pool, 500)
        assert pool.sealed() == []                  # all in a filling slot
        src.abandon()                               # the agent killed: its threads end ...
        pool.abandon()                              # ... and its pool is let go
        client.close()                              # the writer's end of file comes after
    finally:
        src.close()                                 # joins the connection's thread
    assert pool.stats()["records_appended"] == 500
    again = _pool(tmp_path)
    values = [v for s in again.sealed() for _t, _k, v in s.records()]
    assert values == [b"id-%06d hello" % i for i in range(500)]
    assert again.counters["filling_kept"] == 1
    again.close()


def test_a_graceful_stop_appends_the_line_a_connected_writer_left_unended(tmp_path,
                                                                          monkeypatch):
    """The writer still connected, mid-line, when the agent stops: the fragment is a record
    (``partial_line_flushed``), not dropped unsaid with the connection. The accepting thread is
    held after it started the connection's (as a loaded host once did): the stop must still
    wait for that connection."""
    real_start = threading.Thread.start

    def start_then_stall(thread):
        real_start(thread)
        if thread.name == "docket-socket-conn":
            time.sleep(0.5)

    monkeypatch.setattr(threading.Thread, "start", start_then_stall)
    pool = _pool(tmp_path)
    cfg = SourceConfig(index=0, type="socket", topic="t", path=str(tmp_path / "in.sock"))
    metrics = Metrics()
    src = SocketSource(cfg, pool, metrics)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(cfg.path)
        client.sendall(b"".join(b"id-%06d hello\n" % i for i in range(3)) + b"id-0003 hel")
        _wait_appended(pool, 3)
        src.close()                                 # the writer has not closed
    pool.seal_all()
    values = [v for s in pool.sealed() for _t, _k, v in s.records()]
    assert values == [b"id-%06d hello" % i for i in range(3)] + [b"id-0003 hel"]
    assert metrics.get("agent_source_bad_input_total", kind="partial_line_flushed",
                       topic="t") == 1
    pool.close()


def test_what_is_left_in_the_kernel_is_read_once_not_for_as_long_as_a_sender_writes():
    """At a stop the source reads what the kernel holds for a connection; a sender that goes
    on writing meanwhile must not hold it there (nor its memory grow without end). The
    connection here has 100,000 bytes queued when asked and then never runs dry."""
    from agent.tail.sock import READ_BYTES, left_in

    ours, theirs = socket.socketpair()
    theirs.sendall(b"x" * 100_000)

    class Endless:
        calls = 0

        def fileno(self):
            return ours.fileno()

        def settimeout(self, _t):
            pass

        def recv(self, n):
            Endless.calls += 1
            assert Endless.calls < 1_000, "still reading a sender that never stops"
            return b"x" * min(n, 65536)

    try:
        got = left_in(Endless())
        assert 100_000 <= len(got) <= 100_000 + READ_BYTES + 65536
    finally:
        ours.close()
        theirs.close()


def test_an_append_waiting_for_room_when_the_agent_is_killed_appends_and_journals_no_more():
    """The pool full, a listener's append waits for room; the simulated kill comes meanwhile:
    what the wait returns with is all (no further try, no journal entry a dead agent could
    not write)."""
    from agent.buffer import Chunk
    from agent.buffer.slots import AppendResult
    from agent.tail.sock import PoolFeed

    stopped = threading.Event()
    journal, tries = [], []

    class FullPool:
        def append(self, topic, chunk, **kw):
            tries.append(len(chunk))
            feed.abandoned = True             # the kill, while this waited
            stopped.set()
            return AppendResult(records=1)

    class Journal:
        def record(self, *args, **kw):
            journal.append(args)

    feed = PoolFeed("t", FullPool(), Metrics(), lambda: None, stopped, Journal())
    chunk = Chunk.of_values([b"a", b"b", b"c"], 0, None)
    assert feed.append(chunk, 3) == 1
    assert tries == [3] and journal == []
