"""An idle agent sleeps (``agent/wake.py``): with nothing filling, sealed or on its way, the
loop waits until its next duty, up to ``IDLE_WAIT_QUIET_S``, on one descriptor that a write to
a watched file, a stop or a signal makes readable — on both send paths; with the write watch on
every folder and no file settling, the timed scan is only a safety net."""

from __future__ import annotations

import os
import select
import signal
import threading

from agent.loop import (
    GATHER_LIKELY,
    GATHER_WAITS,
    IDLE_WAIT_QUIET_S,
    IDLE_WAIT_S,
    IDLE_WAIT_WATCHED_S,
    WATCHED_SCAN_S,
)
from agent.service import Agent, Seams
from tests.unit.fakenative import FakeSlotProducer
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock
from tests.unit.test_native_path import config


def _agent(tmp_path, send_path="native", file_events=True):
    kafka = FakeKafka()
    return Agent(config(tmp_path, send_path),
                 seams=Seams(clock=FakeClock(), file_events=file_events,
                             producer_factory=kafka.producer, probe_factory=kafka.admin,
                             native_factory=lambda conf: FakeSlotProducer(conf, kafka)))


def readable(fd: int, timeout_s: float = 1.0) -> bool:
    return bool(select.select([fd], [], [], timeout_s)[0])


def _settled(agent) -> None:
    """Turns until the file found at the start is decided on and read (the clock moving)."""
    agent.begin()
    for _ in range(10):
        agent.clock.advance(0.3)
        agent.turn()
    assert not any(f.settling() for f in agent.file_sources)


def test_both_paths_sleep_until_the_next_duty_on_the_wake_descriptor(tmp_path):
    for send_path in ("native", "python"):
        work = tmp_path / send_path
        work.mkdir()
        (work / "app.log").write_bytes(b"")
        agent = _agent(work, send_path)
        try:
            _settled(agent)
            wait, fd = agent._idle_wait(False)
            assert IDLE_WAIT_S <= wait <= IDLE_WAIT_QUIET_S and fd >= 0, send_path
            assert not readable(fd, 0)
            with open(work / "app.log", "ab") as f:
                f.write(b"a line\n")
            assert readable(fd), f"{send_path}: a write must end the sleep"
            agent.turn()
            agent.drain.idle = lambda: False        # something on its way
            agent.drain.waits_for_seal = lambda: False
            assert agent._idle_wait(False) == ((IDLE_WAIT_WATCHED_S, fd) if send_path == "native"
                                               else (IDLE_WAIT_S, -1))
        finally:
            agent.abandon()


def test_a_stop_from_another_thread_ends_the_sleep(tmp_path):
    (tmp_path / "app.log").write_bytes(b"")
    agent = _agent(tmp_path)
    try:
        _settled(agent)
        _wait, fd = agent._idle_wait(False)
        assert not readable(fd, 0)
        threading.Thread(target=agent.stop).start()
        assert readable(fd) and agent._stop.is_set()
        agent.turn()                               # the turn empties the pipe
        assert not readable(agent._idle_wait(False)[1], 0)
    finally:
        agent.abandon()


def test_a_signal_ends_the_sleep_and_the_handler_runs(tmp_path):
    (tmp_path / "app.log").write_bytes(b"")
    agent = _agent(tmp_path)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        _settled(agent)
        agent.install_signals()
        _wait, fd = agent._idle_wait(False)
        os.kill(os.getpid(), signal.SIGHUP)
        assert readable(fd) and agent._reload.is_set()
    finally:
        agent.abandon()                            # the wake-up descriptor is given back
        for s, handler in before.items():
            signal.signal(s, handler)
    assert signal.set_wakeup_fd(-1) == -1


def test_after_a_reload_the_sleep_is_on_the_new_write_watch_whoever_has_the_old_number(
        tmp_path, monkeypatch):
    """A reload closes the write watch and builds another; the old one's number goes to the
    next descriptor opened — a regular file (which epoll refuses with EPERM: an agent died of
    it after a reload in a test run), or the new watch itself. Either way the loop sleeps on
    the new watch, and a write ends the sleep.

    The test closes or replaces only numbers it holds: other threads of the process (a Kafka
    client's, left by an earlier test) open and close sockets meanwhile. An earlier version
    closed the watch and then put a file on the freed number, and with a thread making
    sockets beside it replaced 17 of them in 700 runs, whose clients close them again later
    under whatever holds the number then: the likeliest cause of a CI run's "database is
    locked" in the next test. So the watch is closed straight into a file the test opened
    (``dup2`` closes and reuses the number in one step), never closed and then taken."""
    for case in ("a regular file", "the new watch"):
        work = tmp_path / case.replace(" ", "_")
        work.mkdir()
        (work / "app.log").write_bytes(b"")
        agent = _agent(work)
        held, ours = -1, []                         # ours: the old number, once the test's
        try:
            _settled(agent)
            watch = agent.watch.writes
            old = watch.fd
            _wait, fd = agent._idle_wait(False)
            held = os.open(work / "app.log", os.O_RDONLY)

            def closed_into_the_file(watch=watch, held=held, ours=ours):   # into a file
                os.dup2(held, watch.fd)
                ours.append(watch.fd)
                watch.fd = -1
            monkeypatch.setattr(watch, "close", closed_into_the_file)
            agent._close_sources()                  # what a reload does, in its order
            agent._build_sources(agent.cfg)
            writes = agent.watch.writes
            if case == "the new watch":
                os.dup2(writes.fd, old)             # the new watch under the old number
                os.close(writes.fd)                 # the watch lives on under the old one
                writes.fd = old
                ours.clear()                        # the watch's now
            assert (writes.fd != old) if case == "a regular file" else (writes.fd == old)
            assert agent._idle_wait(False)[1] == fd
            agent.turn()
            assert not readable(fd, 0)
            with open(work / "app.log", "ab") as f:
                f.write(b"a line\n")
            assert readable(fd), f"{case}: a write must end the sleep"
        finally:
            agent.abandon()
            for n in ([held] if held >= 0 else []) + ours:
                os.close(n)


def test_with_the_write_watch_on_every_folder_the_timed_scan_is_a_safety_net(tmp_path):
    """Scans every ``WATCHED_SCAN_S`` (events ask for the others), but every
    ``poll_interval_ms`` while a file found waits to be decided on, and without file events."""
    for events, every in ((True, WATCHED_SCAN_S), (False, 0.25)):
        work = tmp_path / str(events)
        work.mkdir()
        (work / "app.log").write_bytes(b"the first line of the file\n")
        agent = _agent(work, file_events=events)
        try:
            _settled(agent)
            agent.clock.advance(WATCHED_SCAN_S)
            agent.turn()                            # a scan, due
            assert abs(agent._next_scan - agent.monotonic() - every) < 1e-6
            # Rotated, and the new file so far a prefix of the old one (a copy being written?):
            # it waits to be decided on, and scans come often meanwhile.
            (work / "app.log").rename(work / "app.log.1")
            (work / "app.log").write_bytes(b"the first")
            agent.clock.advance(WATCHED_SCAN_S)
            agent.turn()
            assert any(f.settling() for f in agent.file_sources)
            assert abs(agent._next_scan - agent.monotonic() - 0.25) < 1e-6
        finally:
            agent.abandon()


def test_a_socket_source_s_records_end_the_sleep(tmp_path):
    """A socket source's threads append without the loop; each append wakes it, so an agent
    with one sleeps as long as any other."""
    import socket

    from agent.config import parse

    path = str(tmp_path / "in.sock")
    cfg = parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * 4096, "slot_size_bytes": 4096,
                   "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9", "send_path": "native"},
        "audit": {"enabled": False},
        "sources": [{"type": "socket", "topic": "t", "path": path}],
    })
    kafka = FakeKafka()
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), file_events=True,
                                   producer_factory=kafka.producer, probe_factory=kafka.admin,
                                   native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    try:
        agent.begin()
        agent.turn()
        wait, fd = agent._idle_wait(False)
        assert IDLE_WAIT_S <= wait <= IDLE_WAIT_QUIET_S and not readable(fd, 0)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            client.sendall(b"an event\n")
            assert readable(fd), "an appended record must end the sleep"
    finally:
        agent.abandon()
        for s in agent.socket_sources:
            s.close()


def _gathering(tmp_path, gather_ms: float, recent_lines: int = 100,
               send_filling: bool = False, clock_moves: bool = True) -> list[int]:
    """An agent that read ``recent_lines`` lines in the last second, woken by one line, a
    second line written while its turn gathers: the record count of each slot the two lines
    were sealed in (with ``send_filling``, of each show of the slot sent while it fills).
    ``clock_moves`` False: the gather's waits end without the clock moving (each ended early
    by a report), and the turn still ends, after ``GATHER_WAITS`` of them."""
    (tmp_path / "app.log").write_bytes(b"")
    cfg = config(tmp_path, "native")
    cfg.values["buffer.gather_ms"] = gather_ms
    cfg.values["buffer.send_filling"] = send_filling
    kafka = FakeKafka()
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), producer_factory=kafka.producer,
                                   probe_factory=kafka.admin,
                                   native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    try:
        _settled(agent)
        waits = []
        wait = agent.drain.wait

        def gathering(timeout_s, wake_fd=-1):
            """The gather's wait (a wait deaf to writes): the clock moves on; the first one
            after the earlier lines sees a second line arrive meanwhile."""
            if wake_fd == -1 and timeout_s == gather_ms / 1000:
                waits.append((timeout_s, wake_fd))
                if len(waits) == 1 and agent.pool.counters["records_appended"] >= recent_lines:
                    with open(tmp_path / "app.log", "ab") as f:
                        f.write(b"the second line\n")
            if clock_moves or not waits:
                agent.clock.advance(timeout_s)
            wait(0, wake_fd)
        agent.drain.wait = gathering
        with open(tmp_path / "app.log", "ab") as f:
            f.write(b"".join(b"earlier line %d\n" % i for i in range(recent_lines)))
        for _ in range(3):
            agent.turn()
        for _ in range(12):                      # their second passes, all of them sealed
            agent.clock.advance(0.1)
            agent.turn()
        assert agent.pool.counters["records_appended"] == recent_lines
        assert not waits, "no gather before a second of lines came"
        if gather_ms:                            # (measured only where a gather may come)
            assert 0.9 * recent_lines <= agent._arrival_rate() <= recent_lines
        sealed = []
        if send_filling:
            show = agent.pool._show

            def showing(fill, show=show):
                before = fill.shown_records
                view = show(fill)
                if fill.records > before:
                    sealed.append(fill.records - before)
                return view
            agent.pool._show = showing
        else:
            agent.pool._on_seal = lambda slot, seal=agent.pool._on_seal: (
                sealed.append(slot.record_count), seal(slot))
        with open(tmp_path / "app.log", "ab") as f:
            f.write(b"the first line\n")
        assert readable(agent.watch.wake_fd)
        agent.turn()
        if gather_ms and recent_lines * gather_ms / 1000 >= GATHER_LIKELY:
            assert waits and waits[0] == (gather_ms / 1000, -1), "deaf to writes, that long"
            assert len(waits) == (1 if clock_moves else GATHER_WAITS)
        else:
            assert not waits
            with open(tmp_path / "app.log", "ab") as f:
                f.write(b"the second line\n")
            agent.turn()
        for _ in range(3):
            agent.turn()
        return sealed
    finally:
        agent.abandon()


def test_a_write_that_wakes_a_quiet_agent_gathers_what_follows_into_its_slot(tmp_path):
    """``buffer.gather_ms``: the turn a write wakes waits that long before it reads, so the
    line written meanwhile shares its slot (one seal, one sync, one transaction); without it
    each line is sealed alone (a reader that caught up seals at once)."""
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    assert _gathering(tmp_path / "on", 20) == [2]
    assert _gathering(tmp_path / "off", 0) == [1, 1]


def test_a_write_is_gathered_with_others_only_when_lines_come_that_often(tmp_path):
    """The gather waits only when the last second brought at least one record per two
    ``gather_ms`` (20 ms: 25 a second): at 10 lines a second a second line would seldom come
    within the wait, which would add latency and save nothing, so each line goes alone; at 100
    a second they share a slot. The same for the slot sent while it fills (one show for
    both)."""
    for name, lines, filling, want in (("slow", 10, False, [1, 1]), ("fast", 100, False, [2]),
                                       ("slow-filling", 10, True, [1, 1]),
                                       ("fast-filling", 100, True, [2])):
        (tmp_path / name).mkdir()
        assert _gathering(tmp_path / name, 20, lines, filling) == want, name
    (tmp_path / "stuck").mkdir()
    assert _gathering(tmp_path / "stuck", 20, 100, clock_moves=False) == [2]


def test_importing_the_agent_starts_no_blas_threads():
    """numpy's OpenBLAS would start a thread per further core at import, each spinning some
    50 ms of CPU at every start (``agent/__init__.py``): the agent's process has one thread
    after importing everything it runs, and a value the user set is kept."""
    import subprocess
    import sys

    code = ("import agent.service, os, time; time.sleep(0.2); "
            "print(len(os.listdir('/proc/self/task')), os.environ['OPENBLAS_NUM_THREADS'])")
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def threads_and_setting(**set_here) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        return subprocess.run([sys.executable, "-c", code], env={**env, **set_here}, cwd=here,
                              check=True, capture_output=True, text=True,
                              timeout=60).stdout.split()

    assert threads_and_setting() == ["1", "1"]
    assert threads_and_setting(OPENBLAS_NUM_THREADS="2")[1] == "2"
