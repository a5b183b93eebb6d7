"""Syslog over TCP into Kafka: docket's syslog source beside rsyslog (``imtcp`` → ``omkafka``),
same broker, same run, alternating.

A sender writes MESSAGES RFC 5424 messages (newline-ended, about 120 bytes, as ``logger``
writes them) over one TCP connection as fast as the receiver reads; each shipper is timed from
the connection until Kafka holds every message (the topic's high watermarks), with the CPU its
process spent meanwhile (its start not counted). Two forms each:

- ``json``: docket's default (each message's fields as one JSON object); rsyslog's
  ``%jsonmesg%`` (its parsed message as JSON);
- ``raw``: the message as received; rsyslog's ``%rawmsg%``.

rsyslog sends with acks=all, idempotence, snappy and linger.ms 5 (as in ``bench_peers.py``),
docket with its defaults (``sync_on_seal`` on). Each shipper runs ROUNDS times; the best run is
kept. docket's rounds of a form share one state folder, as an agent restarted on its host does:
the first round's pool is new, and the first write to each page of a new pool file costs the
kernel a fault that zero-fills it (7-28 CPU-µs a page here, once in the pool's life: about a
quarter of that round's CPU, ``docs/performance.md``); that round is also printed alone
(``docket_FORM_new_pool``). Ratios: docket / rsyslog per form, events/s and CPU per event.
Prints one JSON line; without rsyslog (``make bench-tools``) docket runs alone.
``BENCH_SYSLOG_MESSAGES`` sets the count.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import AgentProcess, free_port, write_config  # noqa: E402
from tests.bench.bench_peers import RSYSLOGD, Watched, stop, wait_for  # noqa: E402
from tests.kafkautil import bench_kafka  # noqa: E402

MESSAGES = int(os.environ.get("BENCH_SYSLOG_MESSAGES", "300000"))
ROUNDS = 2
RUN = time.strftime("%Y%m%d%H%M%S")

RSYSLOG_TCP_CONF = """\
global(workDirectory="{work}" maxMessageSize="64k")
module(load="imtcp")
module(load="omkafka")
template(name="out" type="string" string="{prop}")
ruleset(name="tokafka" queue.type="LinkedList" queue.filename="q" queue.size="100000"
        queue.saveOnShutdown="on" queue.dequeueBatchSize="1024") {{
    action(type="omkafka" topic="{topic}" broker=["{bootstrap}"] template="out"
           partitions.auto="on" confParam=["compression.codec=snappy", "acks=all",
           "enable.idempotence=true", "linger.ms=5", "socket.nagle.disable=true"])
}}
input(type="imtcp" address="127.0.0.1" port="{port}" ruleset="tokafka")
"""
RSYSLOG_PROPERTY = {"json": "%jsonmesg%", "raw": "%rawmsg%"}


def wire() -> bytes:
    host = socket.gethostname()
    return b"".join(
        b"<134>1 2026-12-03T17:21:04.%06dZ %s billing 4242 PAY [req@1 id=\"%d\"] id-%08d "
        b"payment accepted for order %d\n" % (i % 1_000_000, host.encode(), i, i, i * 7)
        for i in range(MESSAGES))


def send(port: int, data: bytes) -> float:
    """Connect and send ``data``; returns when the connection began (perf_counter)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    t0 = time.perf_counter()
    with s:
        s.sendall(data)
    return t0


def measured(bootstrap: str, topic: str, port: int, data: bytes, w: Watched) -> dict:
    w.sample()
    cpu0 = w.cpu_s
    t0 = send(port, data)
    elapsed, held = wait_for(bootstrap, topic, w, t0, want=MESSAGES)
    w.sample()
    cpu = w.cpu_s - cpu0
    return {"events_s": round(MESSAGES / elapsed), "cpu_us_per_event": round(cpu / MESSAGES * 1e6,
                                                                               2),
            "cores": round(cpu / elapsed, 2), "peak_rss_mb": round(w.hwm_mb, 1),
            "records": held}


def run_docket(bootstrap: str, form: str, work: Path, data: Path, state: Path) -> dict:
    """One run of the agent on the state folder ``state`` (the rounds of a form share it)."""
    topic = f"bench.syslog.docket.{form}.{work.name}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=3)])
    port = free_port()
    work.mkdir()
    config = write_config(work / "agent.toml", bootstrap, state,
                          [{"type": "syslog", "listen": f"127.0.0.1:{port}", "topic": topic,
                            "format": form}],
                          buffer={"size_bytes": 1 << 30, "slot_size_bytes": 1 << 20,
                                  "sync_on_seal": True},
                          agent={"id": "bench"})
    agent = AgentProcess(config, work / "agent.log").start()
    try:
        return measured(bootstrap, topic, port, data.read_bytes(), Watched(agent.proc))
    finally:
        agent.stop()


def run_rsyslog(bootstrap: str, form: str, work: Path, data: Path) -> dict:
    import subprocess

    topic = f"bench.syslog.rsyslog.{form}.{work.name}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=3)])
    port = free_port()
    work.mkdir()
    conf = work / "rsyslog.conf"
    conf.write_text(RSYSLOG_TCP_CONF.format(work=work, topic=topic, bootstrap=bootstrap,
                                            port=port, prop=RSYSLOG_PROPERTY[form]))
    log = open(work / "rsyslogd.out", "wb")
    proc = subprocess.Popen([RSYSLOGD, "-n", "-f", str(conf), "-i", str(work / "rsyslogd.pid")],
                            stdout=log, stderr=log, start_new_session=True)
    log.close()
    try:
        return measured(bootstrap, topic, port, data.read_bytes(), Watched(proc))
    finally:
        stop(proc)


def best(runs: list[dict]) -> dict:
    return max(runs, key=lambda r: r["events_s"]) | {"runs": len(runs)}


def main() -> None:
    have_rsyslog = os.path.exists(RSYSLOGD)
    with tempfile.TemporaryDirectory(prefix="bench-syslog-") as tmp:
        work = Path(tmp)
        data = work / "wire.txt"
        data.write_bytes(wire())
        with bench_kafka(work) as bootstrap:
            runs: dict[str, list[dict]] = {}
            for r in range(ROUNDS):
                for form in ("json", "raw"):
                    runs.setdefault(f"docket_{form}", []).append(
                        run_docket(bootstrap, form, work / f"docket-{form}-{r}", data,
                                   work / f"docket-{form}-state"))
                    if have_rsyslog:
                        runs.setdefault(f"rsyslog_{form}", []).append(
                            run_rsyslog(bootstrap, form, work / f"rsyslog-{form}-{r}", data))
    results = {name: best(rs) for name, rs in runs.items()}
    for form in ("json", "raw"):             # the first round, on a pool made for it
        if runs.get(f"docket_{form}"):
            results[f"docket_{form}_new_pool"] = runs[f"docket_{form}"][0]
    ratios = {}
    for form in ("json", "raw"):
        d, p = results.get(f"docket_{form}"), results.get(f"rsyslog_{form}")
        if d and p:
            ratios[form] = {"events_s": round(d["events_s"] / p["events_s"], 2),
                            "cpu_per_event": round(d["cpu_us_per_event"]
                                                   / p["cpu_us_per_event"], 2)}
    print(json.dumps({"bench": "syslog_tcp", "messages": MESSAGES, "results": results,
                      "ratios_docket_over_rsyslog": ratios,
                      "goal": "events/s >= 2x rsyslog's at <= 0.5x its CPU per event",
                      "missing": [] if have_rsyslog else ["rsyslog"]}))


if __name__ == "__main__":
    main()
