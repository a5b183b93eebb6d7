"""The unix socket source on a real socket and a real pool: what it read survives a crash
though no slot holding it was sealed (a writer cannot be asked again); a line the writer left
unended at the crash is not made a record."""

from __future__ import annotations

import socket
import time

from agent.buffer import BufferPool
from agent.config import SourceConfig
from agent.tail.sock import SocketSource
from agent.telemetry import Metrics


def _pool(tmp_path) -> BufferPool:
    return BufferPool(tmp_path / "pool", 16 << 20, 1 << 20, linger_ms=1e9, sync_on_seal=False)


def test_lines_read_from_the_socket_survive_a_crash_before_their_slot_is_sealed(tmp_path):
    pool = _pool(tmp_path)
    cfg = SourceConfig(index=0, type="socket", topic="t", path=str(tmp_path / "in.sock"))
    metrics = Metrics()
    src = SocketSource(cfg, pool, metrics)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(cfg.path)
            client.sendall(b"".join(b"id-%06d hello\n" % i for i in range(500)) + b"id-0005")
            deadline = time.monotonic() + 10
            while pool.stats()["records_appended"] < 500 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pool.stats()["records_appended"] == 500
            assert pool.sealed() == []                  # all in a filling slot
            pool.abandon()                              # the agent killed
    finally:
        src.close()
    again = _pool(tmp_path)
    values = [v for s in again.sealed() for _t, _k, v in s.records()]
    assert values == [b"id-%06d hello" % i for i in range(500)]
    assert again.counters["filling_kept"] == 1
    again.close()
