"""The reconciler SIGKILLed while the audit topic fills and alerts fire and resolve: after its
restarts, every alert reached the webhook receiver, each once by its idempotency key, and the
database holds each alert once."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from collections import Counter

import pytest

from broker.admin import ensure_audit_topic
from tests.auditkit import AuditJob
from tests.integration.test_reconcile import (
    ORIGINS,
    Receiver,
    caught_up,
    count,
    progress,
    send,
)

W = 600_000
NOW = int(time.time() * 1000)
T0 = (NOW - 3 * 3_600_000) // W * W
TOPICS = [f"app.t{i}" for i in range(8)]
WINDOWS = 6


def plan(rng: random.Random):
    """The audit records in the order they are sent, and the alerts they must end with:
    every (topic, window, origin) reported by the producer (one round of the agents per topic,
    round ``seq`` 1 upwards) and the cluster; some origins short at the cluster (loss), half of
    which a later report completes (``late``: sent once their alerts fired, so they clear from
    them, and resolve those left with none short)."""
    batches, late, open_losses, resolved = [], [], set(), set()
    for seq, topic in enumerate(TOPICS, start=1):
        batch = []
        for w in range(WINDOWS):
            window = T0 + w * W
            for origin in ORIGINS:
                n = rng.randrange(100, 1000)
                short = rng.random() < 0.15
                batch.append(count("producer", topic, origin, n, window=window, seq=seq))
                batch.append(count("kafka-local", topic, origin, n - 7 if short else n,
                                   window=window))
                if short:
                    key = (topic, window, origin)
                    if rng.random() < 0.5:
                        resolved.add(key)
                        late.append(count("kafka-local", topic, origin, n, window=window,
                                          seq=2))
                    else:
                        open_losses.add(key)
        batches.append(batch)
    return batches, late, open_losses, resolved


def grouped(open_losses: set, resolved: set) -> tuple[set, set]:
    """The alerts those losses make: one per (topic, window) (the tier is one), however many
    origins are short there; resolved when every short origin of it was completed."""
    still_short = {(t, w) for t, w, _o in open_losses}
    every = {(t, w) for t, w, _o in open_losses | resolved}
    return still_short, every - still_short


@pytest.mark.slow
def test_a_reconciler_killed_and_restarted_mid_stream_loses_no_alert_and_repeats_none(
        kafka, tmp_path, topic_name):
    rng = random.Random(11)
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    receiver = Receiver()
    (tmp_path / "reconcile.toml").write_text(
        f'[reconcile]\nbootstrap_servers = "{kafka.bootstrap_servers}"\n'
        f'audit_topic = "{audit_topic}"\nevaluate_interval_ms = 1000\nlisten = ""\n'
        f'deliver_interval_ms = 200\n\n[windows]\ntiers = ["producer", "kafka-local"]\n\n'
        f'[alerts]\nsilent_ms = 86400000\nclock_skew_ms = 86400000\n'
        f'default_channels = ["ops"]\n\n'
        f'[channels.ops]\ntype = "webhook"\nurl = "{receiver.url}"\n')
    db = tmp_path / "reconcile.db"
    args = ["reconcile", "--db", str(db), "--config", str(tmp_path / "reconcile.toml")]
    batches, late, short, completed = plan(rng)
    open_losses, resolved = grouped(short, completed)
    # The count job announces itself; once a batch of counts is acknowledged, its marks say
    # (a batch later, as the jobs' marks come) it has read past that round of the agents. A
    # mark sent before the counts it vouches for has the tier judged without them: a loss
    # that is not (this feed once sent every mark first, and a reconciler that took its ends
    # between a round's report and its count, on another partition, fired such alerts).
    send(kafka.bootstrap_servers, audit_topic,
         [progress("kafka-local", at=NOW + 600_000, marks=True)])
    fired = {("firing", k) for k in open_losses | resolved}
    all_fired = threading.Event()

    def writer():
        for seq, batch in enumerate(batches, start=1):   # one topic every 0.5-1 s, its
            send(kafka.bootstrap_servers, audit_topic, batch)    # marks with the next batch
            time.sleep(rng.uniform(0.5, 1.0))
            send(kafka.bootstrap_servers, audit_topic,
                 [caught_up("kafka-local", o, seq=seq, batch=seq) for o in ORIGINS])
        if all_fired.wait(180):
            for half in (late[::2], late[1::2]):     # the late reports, in two parts
                send(kafka.bootstrap_servers, audit_topic, half)
                time.sleep(rng.uniform(0.5, 1.0))

    log = tmp_path / "reconcile.log"
    job = AuditJob(args, log).start()
    feeding = threading.Thread(target=writer)
    feeding.start()
    kills = 0
    try:
        while feeding.is_alive() or kills < 4:
            time.sleep(rng.uniform(1.5, 3.0))           # time to read, judge and send some
            job.kill()
            kills += 1
            # Every reconciler so far has ended (``kill`` waits): their start lines are all in
            # the log. One killed while still starting (its imports take longer than its life
            # on a loaded host) left none, so the last one's line is counted from here.
            started_before = _starts(log)
            job = AuditJob(args, log).start()
            if kills == 1:
                # One reconciler killed at once, before its imports are done: what a loaded
                # host did by chance (a run waited for a start line that never came).
                job.kill()
                kills += 1
                started_before = _starts(log)
                job = AuditJob(args, log).start()
            if _received(receiver) >= fired:
                all_fired.set()
        feeding.join()
        assert all_fired.is_set(), "not every loss alert fired while the writer waited"
        expected = {("firing", k) for k in open_losses | resolved} | \
            {("resolved", k) for k in resolved}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _received(receiver) >= expected and _all_delivered(db):
                break
            time.sleep(0.5)
        # The last reconciler may still be starting (its predecessors may have delivered
        # everything): stop it once it runs, so its exit says how it stops, not how Python
        # dies of a SIGTERM during its imports.
        _wait_until_started(log, starts=started_before + 1, job=job)
        assert job.stop() == 0, job.log_text()
    finally:
        receiver.close()
        job.kill()                  # stopped above unless an assertion failed: never left behind
    assert kills >= 4
    assert kills + 1 - _starts(log) >= 1, "no reconciler was killed while starting"
    bodies = [b for b in receiver.bodies if b["kind"] == "loss"]
    got = Counter((b["event"], (b["topic"], b["window_start"])) for b in bodies)
    assert set(got) == expected, (sorted(set(got) - expected)[:5], sorted(expected - set(got))[:5])
    # Each notification once by its key; a kill between a send and its commit may send one
    # again with the same key (the receiver's to drop), at most one per kill.
    keys = Counter(b["idempotency_key"] for b in bodies)
    assert len(keys) == len(expected)
    assert sum(keys.values()) - len(keys) <= kills, keys.most_common(3)
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT status, topic, window_start FROM alerts "
                        "WHERE kind = 'loss'").fetchall()
    members = conn.execute("SELECT a.topic, a.window_start, m.origin, m.status FROM alerts a "
                           "JOIN alert_members m ON m.alert_id = a.id WHERE kind = 'loss'"
                           ).fetchall()
    conn.close()
    assert Counter((t, w) for _s, t, w in rows) == Counter(open_losses | resolved)
    assert {(t, w) for s, t, w in rows if s == "resolved"} == resolved
    # each short origin once a member of its window's alert, cleared when completed
    assert sorted((t, w, o) for t, w, o, _s in members) == sorted(short | completed)
    assert {(t, w, o) for t, w, o, s in members if s == "cleared"} == completed
    print(json.dumps({"kills": kills, "alerts": len(rows), "short_origins": len(members),
                      "resolved": len(resolved),
                      "notifications": len(bodies), "sent_again": sum(keys.values()) - len(keys),
                      "killed_while_starting": kills + 1 - _starts(log)}))


STARTED = "INFO docket.audit.reconcile: reconciling "     # a reconciler's start line


def _starts(log) -> int:
    """The start lines in the reconcilers' shared log."""
    return log.read_text(errors="replace").count(STARTED) if log.exists() else 0


def _wait_until_started(log, starts: int, job: AuditJob, timeout_s: float = 120) -> None:
    """Until the shared log holds ``starts`` reconcilers' start lines."""
    deadline = time.monotonic() + timeout_s
    while _starts(log) < starts:
        assert job.proc.poll() is None, job.log_text()
        assert time.monotonic() < deadline, f"reconciler {starts} not started:\n" \
            + job.log_text()
        time.sleep(0.2)


def _received(receiver: Receiver) -> set:
    return {(b["event"], (b["topic"], b["window_start"]))
            for b in list(receiver.bodies) if b["kind"] == "loss"}


def _all_delivered(db) -> bool:
    try:
        conn = sqlite3.connect(db, timeout=5)
        try:
            (pending,) = conn.execute("SELECT count(*) FROM alert_deliveries "
                                      "WHERE status != 'delivered'").fetchone()
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return False
    return pending == 0
