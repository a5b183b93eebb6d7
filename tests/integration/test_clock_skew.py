"""Producer hosts whose clocks are off must never page anyone.

Five agents, each a real ``docket-agent`` process writing its own log into one Kafka cluster;
four of them see a wall clock 10 and 5 minutes behind and 5 and 10 minutes ahead
(``tests/clockshift.c`` preloaded: ``agentkit.clock_shift_env``), the fifth the true time. The
real count job (``kafka-local``) and land job (``warehouse``) run beside them, and the
reconciler runs as a user runs it, with 1-minute windows and a short grace, so the windows of
the hosts that are behind are judged while those hosts still write into them. Before the Spark
jobs start, the first records of a topic that only the host 5 minutes behind writes are
deleted from Kafka: a real loss.

While it runs: no ``loss`` alert but the real one (naming the deleted record numbers exactly),
no ``silent_producer`` alert. Every id in Kafka once. Then, judged later (past the windows of
the host 10 minutes ahead): every window of the data topic complete at every tier with the
hosts' true counts, each skewed host's clock offset shown and raised as ``clock_skew``, the
host on time not."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
import uuid
from collections import Counter

import pytest
import requests
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from tests.agentkit import (
    AgentProcess,
    clock_shift_env,
    consume_counts,
    free_port,
    write_config,
)
from tests.auditkit import AuditJob, Clock, all_stopped_cleanly
from tests.integration.test_reconcile import Receiver

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("cc") is None,
                                 reason="needs a C compiler for tests/clockshift.c")]

MIN_MS = 60_000
SKEWS = {"skew-minus10": -10, "skew-minus5": -5, "skew-zero": 0, "skew-plus5": 5,
         "skew-plus10": 10}                     # origin → minutes its clock is off
LOSSY_HOST = "skew-minus5"
LOSSY_LINES, DELETED = 300, 200                 # the first 200 of its 300 records deleted
RATE, WRITE_S = 15, 75                          # lines per second per host, for this long


def reconcile_settings(bootstrap: str, audit_topic: str, hook_url: str, listen: str,
                       **alerts) -> dict:
    return {"reconcile": {"bootstrap_servers": bootstrap, "audit_topic": audit_topic,
                          "evaluate_interval_ms": 2000, "deliver_interval_ms": 500,
                          "listen": listen},
            "windows": {"window_ms": MIN_MS, "grace_ms": 20_000, "final_ms": 90_000,
                        "settle_ms": 5000, "tiers": ["producer", "kafka-local", "warehouse"]},
            # Below the largest skew (10 min): a lag or a silence judged by a host's clock would
            # still page. Above what a count job's micro-batch takes on a loaded two-core host:
            # at 120 s, one batch of the local tier's job once took longer while other suites
            # ran beside this test, and its real (arrival-time) lag paged.
            "alerts": {"lag_ms": 300_000, "silent_ms": 300_000, "default_channels": ["hook"],
                       "health_channels": ["hook"], **alerts},
            "channels": {"hook": {"type": "webhook", "url": hook_url}}}


def toml(settings: dict) -> str:
    lines = []
    for section, values in settings.items():
        if section == "channels":
            for name, table in values.items():
                lines.append(f"[channels.{name}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in table.items()]
            continue
        lines.append(f"[{section}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def write_lines(path, host: str, first: int, n: int, rate: float) -> None:
    with open(path, "a") as f:
        for i in range(first, first + n):
            f.write(json.dumps({"id": f"{host}-{i}", "pad": "x" * (i % 50)}) + "\n")
            f.flush()
            time.sleep(1 / rate)


def deleted_numbers(bootstrap: str, topic: str, upto: int) -> tuple[list[int], Counter]:
    """The ``docket-seq`` numbers and the windows of offsets [0, upto) of partition 0."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    numbers, windows = [], Counter()
    try:
        while len(numbers) < upto:
            for msg in c.consume(1000, timeout=1):
                if msg.error() or msg.offset() >= upto:
                    continue
                numbers.append(int.from_bytes(dict(msg.headers())["docket-seq"], "big"))
                windows[msg.timestamp()[1] // MIN_MS * MIN_MS] += 1
    finally:
        c.close()
    return sorted(numbers), windows


def lost_state(db, topic: str, windows: Counter, logs: list) -> dict:
    """The reconciler's view of the lost topic, printed when its loss was not alerted in
    time: each lost window's verdicts per tier and origin and its count records (with the
    producer's ``sealed_through``, which a tier's marks must reach), the jobs' marks and
    progress, what is left to evaluate, the alerts and their deliveries, and the last lines of
    the jobs' and the reconciler's logs: enough to tell a tier not caught up from a reconciler
    not evaluating, or an alert not delivered."""
    out: dict = {"logs": {}}
    for log in logs:
        try:
            out["logs"][log.name] = log.read_text(errors="replace").splitlines()[-40:]
        except OSError as exc:
            out["logs"][log.name] = str(exc)
    conn = sqlite3.connect(db)
    try:
        out.update({
            "windows": {w: conn.execute(
                "SELECT tier, origin, state, reason FROM window_origins WHERE topic = ? AND "
                "window_start = ?", (topic, w)).fetchall() for w in windows},
            "verdicts": conn.execute(
                "SELECT window_start, tier, state, final, count, expected, changed_at FROM "
                "windows WHERE topic = ?", (topic,)).fetchall(),
            "counts": conn.execute(
                "SELECT window_start, tier, origin, emitter, count, distinct_count, seq, "
                "sealed_through, emitted_at, arrived_at FROM counts WHERE topic = ?",
                (topic,)).fetchall(),
            "tiers": conn.execute("SELECT tier FROM topic_tiers WHERE topic = ?",
                                  (topic,)).fetchall(),
            "marks": conn.execute("SELECT tier, source, source_seq, source_delivered, seq, "
                                  "arrived_at FROM caught_up").fetchall(),
            "progress": conn.execute("SELECT * FROM progress").fetchall(),
            "dirty": conn.execute("SELECT count(*) FROM dirty").fetchone(),
            "evaluating": conn.execute("SELECT count(*) FROM evaluating").fetchone(),
            "alerts": conn.execute("SELECT id, kind, status, topic, window_start, tier, "
                                   "origin, fired_at FROM alerts").fetchall(),
            "deliveries": conn.execute("SELECT alert_id, event, status, attempts, last_error "
                                       "FROM alert_deliveries").fetchall()})
    except sqlite3.Error as exc:
        out["error"] = str(exc)
    finally:
        conn.close()
    return out


def test_skewed_producer_clocks_raise_no_false_alarm_and_a_real_loss_is_exact(kafka, tmp_path):
    bootstrap = kafka.bootstrap_servers
    prefix = f"skew{uuid.uuid4().hex[:6]}"
    app, lossy, audit_topic = f"{prefix}.app", f"{prefix}.lost", f"{prefix}.audit"
    ensure_topics(bootstrap, [TopicSpec(app, partitions=3), TopicSpec(lossy, partitions=1)])
    ensure_audit_topic(bootstrap, audit_topic)
    hook = Receiver()
    agents: dict[str, AgentProcess] = {}
    jobs: list[AuditJob] = []
    try:
        for host, minutes in SKEWS.items():
            home = tmp_path / host
            (home / "logs").mkdir(parents=True)
            sources = [{"type": "file", "paths": [str(home / "logs" / "app.log")],
                        "topic": app}]
            if host == LOSSY_HOST:
                sources.append({"type": "file", "paths": [str(home / "logs" / "lost.log")],
                                "topic": lossy})
            config = write_config(
                home / "agent.toml", bootstrap, home / "state", sources,
                agent={"id": host}, buffer={"size_bytes": 16 << 20, "slot_size_bytes": 1 << 18},
                audit={"topic": audit_topic, "window_ms": MIN_MS, "interval_ms": 3000})
            agents[host] = AgentProcess(       # known before it starts: stopped if it fails
                config, home / "agent.log",
                env=clock_shift_env(minutes * 60, tmp_path / "shim") if minutes else {})
            agents[host].start()

        # The real loss: the lossy host's first records, deleted before any job reads them.
        write_lines(tmp_path / LOSSY_HOST / "logs" / "lost.log", f"{LOSSY_HOST}-lost", 0,
                    LOSSY_LINES, rate=1000)
        lost_ids = consume_counts(bootstrap, lossy, LOSSY_LINES, 120)
        assert len(lost_ids) == LOSSY_LINES
        numbers, lost_windows = deleted_numbers(bootstrap, lossy, DELETED)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.delete_records([TopicPartition(lossy, 0, DELETED)]).values():
            future.result(30)
        del admin

        common = ["--bootstrap-servers", bootstrap, "--audit-topic", audit_topic,
                  "--topics", rf"{prefix}\.(app|lost)", "--trigger-s", "2",
                  "--window-ms", str(MIN_MS)]
        jobs.append(AuditJob(["count", "--cluster", "kafka-local", *common, "--checkpoint-dir",
                              str(tmp_path / "ckpt-count")], tmp_path / "count.log").start())
        jobs.append(AuditJob(["land", "--warehouse", str(tmp_path / "warehouse"), *common,
                              "--checkpoint-dir", str(tmp_path / "ckpt-land")],
                             tmp_path / "land.log").start())
        listen = f"127.0.0.1:{free_port()}"
        settings = reconcile_settings(bootstrap, audit_topic, hook.url, listen)
        (tmp_path / "reconcile.toml").write_text(toml(settings))
        db = tmp_path / "r.db"
        reconciler = AuditJob(["reconcile", "--db", str(db), "--config",
                               str(tmp_path / "reconcile.toml")],
                              tmp_path / "reconcile.log").start()
        jobs.append(reconciler)

        writers = [threading.Thread(target=write_lines, args=(
            tmp_path / host / "logs" / "app.log", host, 0, RATE * WRITE_S, RATE))
            for host in SKEWS]
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        written = RATE * WRITE_S

        # Every id in Kafka, once.
        ids = consume_counts(bootstrap, app, written * len(SKEWS), 120,
                             parse=lambda v: json.loads(v)["id"])
        assert len(ids) == written * len(SKEWS)
        assert max(ids.values()) == 1

        def tier_totals() -> dict[tuple[str, str], int]:
            """(tier, origin) → events of the data topic counted, from the reconciler's
            database (distinct where the tier knows it)."""
            if not db.exists():
                return {}
            conn = sqlite3.connect(db)
            try:
                return {(t, o): n for t, o, n in conn.execute(
                    "SELECT tier, origin, sum(coalesce(distinct_count, count)) FROM counts "
                    "WHERE topic = ? GROUP BY tier, origin", (app,))}
            except sqlite3.OperationalError:
                return {}
            finally:
                conn.close()

        want = {(tier, host): written for tier in ("producer", "kafka-local", "warehouse")
                for host in SKEWS}
        lost_alerts = {(lossy, tier, w) for tier in ("kafka-local", "warehouse")
                       for w in lost_windows}

        def lost_alerted() -> bool:
            return lost_alerts <= {(b["topic"], b["tier"], b["window_start"])
                                   for b in hook.bodies if b["kind"] == "loss"}
        deadline = time.monotonic() + 360
        while not (tier_totals() == want and lost_alerted()) and time.monotonic() < deadline:
            for job in jobs:
                assert job.proc.poll() is None, job.log_text()
            time.sleep(0.5)
        if not lost_alerted():                    # what the reconciler knew of the loss
            print(json.dumps(lost_state(db, lossy, lost_windows,
                                        [tmp_path / n for n in ("count.log", "land.log",
                                                                "reconcile.log")]),
                             default=str))
            print(f"now {int(time.time() * 1000)}; the agents' logs are under {tmp_path}")
            # Whether the reconciler evaluates at all (it logs an evaluation only when an alert
            # fires or resolves), and what the hook was sent.
            try:
                seen = requests.get(f"http://{listen}/metrics", timeout=10).text
                print([line for line in seen.splitlines()
                       if line.startswith("reconcile_last_evaluation_timestamp_seconds")])
            except requests.RequestException as exc:
                print(f"the reconciler's /metrics did not answer: {exc}")
            print("hook:", Counter((b.get("event"), b.get("kind"), b.get("tier"))
                                   for b in hook.bodies))
        assert tier_totals() == want
        time.sleep(10)                   # a few more evaluations and rounds, with all counted

        # While it ran: the real loss alerted, exactly; nothing else paged.
        firing = [b for b in hook.bodies if b["event"] == "firing"]
        losses = [b for b in firing if b["kind"] == "loss"]
        paged = Counter((b["kind"], "lost" if b["topic"] == lossy else "app", b["tier"],
                         b["origin"]) for b in firing if b["kind"] != "clock_skew")
        assert paged == Counter({("loss", "lost", tier, LOSSY_HOST): len(lost_windows)
                                 for tier in ("kafka-local", "warehouse")}), paged
        assert {(b["tier"], b["window_start"]) for b in losses} == \
            {(t, w) for t in ("kafka-local", "warehouse") for w in lost_windows}
        for b in losses:
            assert b["detail"]["missing"] == lost_windows[b["window_start"]], b
            assert b["detail"]["missing_ranges"] == [[numbers[0], numbers[-1]]], b
        assert numbers == list(range(numbers[0], numbers[0] + DELETED))

        # The skew is shown, as a fact.
        metrics = requests.get(f"http://{listen}/metrics", timeout=10).text
        offsets = {line.split('origin="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                   for line in metrics.splitlines()
                   if line.startswith("reconcile_producer_clock_offset_seconds{")}
        for host, minutes in SKEWS.items():
            assert abs(offsets[host] - minutes * 60) < 30, (host, offsets)
        skewed = {b["origin"] for b in firing if b["kind"] == "clock_skew"}
        assert skewed == {h for h, m in SKEWS.items() if m}

        # Each host's events lie in the windows its own clock names.
        conn = sqlite3.connect(db)
        first = dict(conn.execute("SELECT origin, min(window_start) FROM counts WHERE "
                                  "tier = 'producer' AND topic = ? AND count > 0 GROUP BY "
                                  "origin", (app,)))
        conn.close()
        for host, minutes in SKEWS.items():
            assert abs(first[host] - first["skew-zero"] - minutes * MIN_MS) <= 2 * MIN_MS, first

        assert all_stopped_cleanly(*jobs)  # as a service manager stops them: no traceback
        jobs.clear()
        live = list(hook.bodies)

        # Judged once every window has ended, the host 10 minutes ahead's too.
        later = parse(reconcile_settings(bootstrap, audit_topic, hook.url, "",
                                         silent_ms=3_600_000, lag_ms=3_600_000))
        Reconciler(later, db, clock=Clock(12 * MIN_MS)).run_once()
        conn = sqlite3.connect(db)
        states = Counter(state for (state,) in conn.execute(
            "SELECT tier || ' ' || state FROM windows WHERE topic = ? AND count > 0", (app,)))
        judged = conn.execute(
            "SELECT tier, sum(coalesce(distinct_count, count)), sum(expected) FROM windows "
            "WHERE topic = ? GROUP BY tier", (app,)).fetchall()
        conn.close()
        assert set(states) == {f"{t} complete" for t in ("producer", "kafka-local",
                                                          "warehouse")}, states
        assert sorted(judged) == [(t, written * len(SKEWS), written * len(SKEWS))
                                  for t in ("kafka-local", "producer", "warehouse")]
        later_losses = [b for b in hook.bodies[len(live):]
                        if b["event"] == "firing" and b["kind"] == "loss"]
        assert later_losses == []
    finally:                             # agents first: nothing of the run may outlive it
        for agent in agents.values():
            if agent.alive():
                agent.stop()
        for job in jobs:
            job.stop()
        hook.close()
