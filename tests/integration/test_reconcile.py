"""The reconciler against the real local Kafka: audit records written by a test producer (as
the agents and the Spark jobs write them), read into SQLite, windows judged, alerts delivered to
a real HTTP receiver on 127.0.0.1.

The clock is the real one: the windows judged lie two hours back, past their grace and final."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import requests
from confluent_kafka import Producer

from audit.contract.record import AuditRecord, CaughtUp, Progress, Ranges
from audit.reconcile.commands import watermark
from audit.reconcile.config import parse
from audit.reconcile.evaluate import evaluate
from audit.reconcile.service import Reconciler
from audit.reconcile.store import Store
from broker.admin import ensure_audit_topic

W = 600_000
NOW = int(time.time() * 1000)
T0 = (NOW - 2 * 3_600_000) // W * W                    # a window two hours back
TOPICS = ["app.events", "app.clicks"]
ORIGINS = ["web-1", "web-2", "web-3"]


class Receiver:
    """A webhook receiver on 127.0.0.1 that records every JSON body it is sent."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.bodies.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def count(tier: str, topic: str, origin: str, n: int, *, window: int = T0, seq: int = 1,
          distinct: int | None = None, checksum: int = 7, at: int | None = None,
          **kw) -> AuditRecord:
    distinct = n if distinct is None else distinct
    return AuditRecord(tier=tier, origin=origin, topic=topic, window_start=window, window_ms=W,
                       count=n, bytes=n * 100, checksum=checksum,
                       emitter=f"{origin}/agent" if tier == "producer" else f"{tier}/count",
                       seq=seq, emitted_at=at or window + W + 60_000 + seq,
                       distinct=distinct, duplicates=n - distinct,
                       incarnation="i1", **kw)


def progress(tier: str, at: int = NOW, batch: int = 100, marks: bool = False) -> Progress:
    """``tier``'s count job at ``at``; with ``marks``, a job that publishes ``caught_up`` marks
    (in its incarnation ``j1``, as ``caught_up`` below): judged caught up by them alone."""
    return Progress(tier=tier, emitter=f"{tier}/count", batch_id=batch, input_rows_per_s=10.0,
                    processed_rows_per_s=10.0, batch_duration_ms=100, offsets_behind=0,
                    emitted_at=at, publishes_caught_up=marks,
                    incarnation="j1" if marks else None)


def caught_up(tier: str, origin: str, seq: int = 1, batch: int = 1) -> CaughtUp:
    """``tier``'s job, in its batch ``batch``, has read past ``origin``'s audit records up to
    ``seq`` (its reports here carry no record numbers: read past by their own ``seq``)."""
    return CaughtUp(tier=tier, emitter=f"{tier}/count", incarnation="j1", seq=batch,
                    source=f"{origin}/agent", source_incarnation="i1", source_seq=seq)


def send(bootstrap: str, topic: str, records, raw: list[bytes] = ()) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for r in records:
        key, value = r.encode()
        p.produce(topic, value, key)
    for value in raw:
        p.produce(topic, value, b"junk")
    assert p.flush(30) == 0


def config(receiver: Receiver | None, bootstrap: str, topic: str, **windows):
    raw = {"reconcile": {"bootstrap_servers": bootstrap, "audit_topic": topic},
           "windows": {"tiers": ["producer", "kafka-local", "warehouse"], **windows}}
    # The agents' reports lie two hours back and no heartbeat follows: not a silent producer,
    # nor a clock two hours behind (they are history, arriving now).
    raw["alerts"] = {"silent_ms": 6 * 3_600_000, "clock_skew_ms": 6 * 3_600_000}
    if receiver is not None:
        raw["channels"] = {"ops": {"type": "webhook", "url": receiver.url}}
        raw["alerts"]["default_channels"] = ["ops"]
    return parse(raw)


def dump(db_path, tables=("counts", "ranges", "progress", "windows", "window_origins",
                          "malformed")) -> dict:
    conn = sqlite3.connect(db_path)
    try:
        out = {}
        for t in tables:
            cols = [c[1] for c in conn.execute(f"PRAGMA table_info({t})")
                    if c[1] not in ("changed_at", "final_at", "last_at")]
            out[t] = sorted(conn.execute(f"SELECT {', '.join(cols)} FROM {t}"))
        return out
    finally:
        conn.close()


def stream() -> list:
    """Every tier's reports on 2 topics × 3 windows × 3 origins, each identity reported at
    several seqs (the newest is the truth), in a shuffled order."""
    rng = random.Random(7)
    out = []
    for topic in TOPICS:
        for w in range(3):
            window = T0 + w * W
            for origin in ORIGINS:
                n = rng.randrange(1000, 5000)
                for seq in (1, 2, 3):
                    part = n * seq // 3
                    out.append(count("producer", topic, origin, part, window=window, seq=seq))
                    out.append(count("kafka-local", topic, origin, part, window=window, seq=seq))
                    out.append(count("warehouse", topic, origin, part, window=window, seq=seq))
    out += [progress("kafka-local", batch=b) for b in (1, 2, 3)]
    out += [Ranges.of(tier="kafka-local", origin=o, origin_incarnation="i1",
                      emitter="kafka-local/count", seq=s, through=10_000, missing=[],
                      incarnation="i1") for o in ORIGINS for s in (1, 2)]
    rng.shuffle(out)
    return out


@pytest.mark.slow
def test_replaying_the_audit_topic_rebuilds_the_same_tables(kafka, tmp_path, topic_name):
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic, partitions=3)
    malformed = [b"not json", b'{"v": 1}', json.dumps({"v": 2}).encode()]
    send(kafka.bootstrap_servers, audit_topic, stream(), malformed)
    cfg = config(None, kafka.bootstrap_servers, audit_topic)

    first = Reconciler(cfg, tmp_path / "a.db")
    first.run_once()
    assert first.applied == len(stream())
    # A second reconciler reads the topic from its start in small batches, stopping halfway
    # and starting again on its database, as a killed and restarted one would.
    second = Reconciler(cfg, tmp_path / "b.db")
    second.open()
    second.consume_batch(timeout_s=5)
    second.close()
    Reconciler(cfg, tmp_path / "b.db").run_once()
    again = Reconciler(cfg, tmp_path / "a.db")     # nothing new: nothing changes
    again.run_once()
    assert again.applied == 0
    for path in ("a.db", "b.db"):
        store = Store(tmp_path / path)
        evaluate(store, cfg, NOW)
        store.close()
    a, b = dump(tmp_path / "a.db"), dump(tmp_path / "b.db")
    assert a == b
    assert sum(r[1] for r in a["malformed"]) == 3
    # Every identity kept its newest record: the totals are those of seq 3.
    conn = sqlite3.connect(tmp_path / "a.db")
    assert conn.execute("SELECT count(*), max(seq), min(seq) FROM counts").fetchone() == \
        (2 * 3 * 3 * 3, 3, 3)
    states = dict(conn.execute("SELECT tier || '/' || state, count(*) FROM windows "
                               "GROUP BY tier, state"))
    assert states == {"producer/complete": 6, "kafka-local/complete": 6,
                      "warehouse/complete": 6}
    conn.close()
    store = Store(tmp_path / "a.db")
    assert watermark(store, "app.events", "warehouse") == T0 + 3 * W
    store.close()


@pytest.mark.slow
def test_a_loss_at_the_cluster_tier_fires_one_alert_and_late_data_resolves_it(
        kafka, tmp_path, topic_name, receiver):
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    cfg = config(receiver, kafka.bootstrap_servers, audit_topic)
    db = tmp_path / "r.db"
    # 0.5% of web-2's 20,000 events are missing at the cluster: numbers 5,000-5,099.
    records = [count("producer", "app.events", o, 20_000) for o in ORIGINS]
    records += [count("kafka-local", "app.events", o, 20_000 if o != "web-2" else 19_900)
                for o in ORIGINS]
    records += [progress("kafka-local", marks=True),
                *(caught_up("kafka-local", o) for o in ORIGINS),
                Ranges.of(tier="kafka-local", origin="web-2", origin_incarnation="i1",
                          emitter="kafka-local/count", seq=1, through=19_999,
                          missing=[[5000, 5099]], incarnation="i1")]
    send(kafka.bootstrap_servers, audit_topic, records)
    Reconciler(cfg, db).run_once()
    Reconciler(cfg, db).run_once()                   # evaluated again: fires nothing new
    [body] = receiver.bodies
    assert (body["event"], body["kind"], body["topic"], body["window_start"], body["tier"],
            body["origin"]) == ("firing", "loss", "app.events", T0, "kafka-local", "web-2")
    assert (body["detail"]["expected"], body["detail"]["actual"]) == (20_000, 19_900)
    assert body["detail"]["missing_ranges"] == [[5000, 5099]]
    # The late records arrive: the cluster tier's next report has them all.
    send(kafka.bootstrap_servers, audit_topic,
         [count("kafka-local", "app.events", "web-2", 20_000, seq=2), progress("kafka-local",
                                                                                batch=101),
          Ranges.of(tier="kafka-local", origin="web-2", origin_incarnation="i1",
                    emitter="kafka-local/count", seq=2, through=19_999, missing=[],
                    incarnation="i1")])
    Reconciler(cfg, db).run_once()
    assert [(b["event"], b["kind"], b["origin"]) for b in receiver.bodies] == \
        [("firing", "loss", "web-2"), ("resolved", "loss", "web-2")]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT status, count(*) FROM alerts GROUP BY status").fetchall() == \
        [("resolved", 1)]
    assert conn.execute("SELECT revision FROM windows WHERE tier = 'kafka-local'").fetchone() \
        == (1,)                                       # the window was final: a revision
    conn.close()


@pytest.mark.slow
def test_a_running_reconciler_serves_its_metrics_until_it_stops(kafka, tmp_path, topic_name):
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    records = [count("producer", "app.events", o, 100) for o in ORIGINS]
    records += [count("kafka-local", "app.events", o, 100) for o in ORIGINS]
    send(kafka.bootstrap_servers, audit_topic, [*records, progress("kafka-local")], [b"junk"])
    cfg = config(None, kafka.bootstrap_servers, audit_topic)
    cfg.values.update({"reconcile.listen": "127.0.0.1:0",
                       "reconcile.evaluate_interval_ms": 1000})
    started: list[Reconciler] = []

    def run():                                      # its connection lives in this thread
        started.append(Reconciler(cfg, tmp_path / "r.db"))
        started[0].run()

    runner = threading.Thread(target=run)
    runner.start()
    judged = 'reconcile_windows{tier="kafka-local",state="complete",final="1"}'
    try:
        deadline = time.monotonic() + 60
        while not (started and started[0].metrics) and time.monotonic() < deadline:
            time.sleep(0.1)
        port = started[0].metrics.port
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:           # read, then evaluated every second
            text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
            seen = dict(line.rsplit(" ", 1) for line in text.splitlines()
                        if not line.startswith("#"))
            if seen.get(judged) == "1":
                break
            time.sleep(0.5)
        assert seen[judged] == "1"
        assert seen["reconcile_records_applied_total"] == "7"
        assert seen['reconcile_records_malformed_total{reason="not_json"}'] == "1"
        assert "reconcile_last_evaluation_timestamp_seconds" in seen
    finally:
        if started:
            started[0].stop_event.set()
        runner.join(60)
    assert not runner.is_alive()
    with pytest.raises(requests.ConnectionError):         # stopped with the reconciler
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
