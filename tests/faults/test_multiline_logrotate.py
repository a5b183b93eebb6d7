"""Multiline events under every fault at once: an application logging 20,000 events/s (every
tenth a Java stack trace of 5 to 200 lines), Debian's logrotate rotating its file with
``create`` and ``compress`` (no ``delaycompress``: the rotated file is gzipped at once, also
while the agent is down), five SIGKILLs of the agent, and the broker paused between them. Every
event must arrive as one record equal to what the application wrote, none lost, none cut, its
duplicates only from slots that could have been in flight at a kill; and the audit's cluster
tier and the reconciler must say the same."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.admin import ensure_audit_topic
from tests.agentkit import consume_counts
from tests.auditkit import judged_windows
from tests.faults.multiline_app import event
from tests.faults.test_agent_faults import RecordNumbers, cluster_tier, in_flight_ids
from tests.integration.test_agent_end_to_end import file_decisions, parse_id, setup_agent

LOGROTATE = shutil.which("logrotate") or "/usr/sbin/logrotate"
APP = Path(__file__).with_name("multiline_app.py")
RATE = 20_000                   # events per second
SECONDS = 12
KILLS = 5
PAUSE_S = 8                     # under librdkafka's 10 s request timeout: a pause, not a loss
ROTATE_EVERY_S = 0.7


def _rotate(conf: Path, state: Path, stop: threading.Event, runs: list) -> None:
    """logrotate forced every ``ROTATE_EVERY_S``, as cron would run it on a busy host."""
    while not stop.wait(ROTATE_EVERY_S):
        runs.append(subprocess.run([LOGROTATE, "-f", "-s", str(state), str(conf)],
                                   capture_output=True, text=True))


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(LOGROTATE), reason="logrotate not installed "
                    "(make setup installs Debian's logrotate)")
def test_multiline_events_under_logrotate_compress_kills_and_a_broker_pause(
        kafka, tmp_path, topic_name):
    bootstrap = kafka.bootstrap_servers
    total = RATE * SECONDS
    audit_topic = f"{topic_name}.audit"
    ensure_audit_topic(bootstrap, audit_topic)
    agent, logs = setup_agent(tmp_path, bootstrap, topic_name, partitions=1,
                              source={"multiline": {"preset": "java"}},
                              buffer={"size_bytes": 384 << 20},
                              audit={"topic": audit_topic})
    app = logs / "app.log"
    app.touch()
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{app} {{\n  rotate 50\n  compress\n  missingok\n  create 0644\n"
                    f"  postrotate\n    flock {logs / 'app.lock'} true\n  endscript\n}}\n")
    cluster = kafka.controlled()
    pool_path = tmp_path / "state" / "buffer.pool"
    rng = random.Random(51)
    allowance: Counter = Counter()
    stop, runs = threading.Event(), []
    agent.start()
    writer = subprocess.Popen([sys.executable, str(APP), str(logs), str(total), str(RATE)],
                              stdout=subprocess.PIPE, text=True)
    rotator = threading.Thread(target=_rotate, args=(conf, tmp_path / "lr.state", stop, runs))
    rotator.start()
    resume = threading.Timer(PAUSE_S, cluster.resume_node, (1,))
    backlog_in_pause = None
    try:
        for k in range(1, KILLS + 1):
            time.sleep(rng.uniform(0.8, 1.6))
            if k == 3:                  # the broker stops; the agent is killed while it is
                cluster.pause_node(1)
                resume.start()
                time.sleep(PAUSE_S / 2)
                backlog_in_pause = agent.status()["backlog"]["events"]
            agent.kill()
            ids = in_flight_ids(pool_path)
            allowance.update(ids)
            print(f"kill {k}: {len(ids)} events in slots that may have been in flight")
            agent.start()
        resume.join(PAUSE_S + 5)
        assert writer.wait(timeout=300) == 0
        time.sleep(2 * ROTATE_EVERY_S)          # a rotation after the last write, too
        stop.set()
        rotator.join(30)
        numbers = RecordNumbers()
        partial: list[bytes] = []

        def see(msg) -> None:
            numbers.see(msg)
            if msg.value() != event(parse_id(msg.value()))[:-1]:
                partial.append(msg.value())

        counts = consume_counts(bootstrap, topic_name, total, 240, parse_id, on_msg=see)
        status = agent.status()
        compressed_copies = agent.metric("agent_source_rotations_total",
                                         kind="compressed_copy")
        unseen = agent.metric("agent_source_rotations_total", kind="compressed_unseen")
    finally:
        if resume.is_alive():
            resume.cancel()
            cluster.resume_node(1)
        stop.set()
        rotator.join(30)
        rc = agent.stop()
        writer.kill()
    assert rc == 0
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    over = {i: (c, allowance[i]) for i, c in counts.items() if c - 1 > allowance[i]}
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    journal = tmp_path / "state" / "loss-journal.jsonl"
    entries = journal.read_text().splitlines() if journal.exists() else []
    gz = sorted(p.name for p in logs.iterdir() if p.name.endswith(".gz"))
    figures = {"events": total, "lines": sum(event(i).count(b"\n") for i in range(total)),
               "kills": KILLS, "paused_s": PAUSE_S, "backlog_in_pause": backlog_in_pause,
               "rotations": len(runs), "gz_files": len(gz),
               "compressed_copies_read": compressed_copies, "unseen_read_whole": unseen,
               "lost": len(missing),
               "partial_events": len(partial), "duplicates": duplicates,
               "bound": sum(allowance.values()), "over_bound": len(over),
               "journaled": len(entries), **numbers.figures()}
    print(json.dumps(figures))
    if missing or over or partial:
        print(file_decisions(tmp_path / "agent.log"))
    # The faults happened: logrotate rotated and gzipped, and the agent had a backlog while
    # the broker was stopped.
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs if r.returncode][:2]
    assert len(runs) >= 10 and len(gz) >= 10, figures
    assert backlog_in_pause and backlog_in_pause > 0, figures
    assert set(counts) <= set(range(total))
    assert not missing, f"{len(missing)} events missing, first {missing[:10]}"
    assert not partial, f"{len(partial)} records not their whole event: {partial[:1]}"
    assert not over, f"{len(over)} events arrived more often than the kills allow: " \
        f"{sorted(over.items())[:10]}"
    assert entries == [] and status["dropped_events"] == 0, entries[:5]
    numbers.check(duplicates)
    # The audit: the cluster tier counts every event once by its number (duplicates apart),
    # and the reconciler judges every window complete.
    cluster_counts = cluster_tier(kafka, tmp_path, topic_name, audit_topic)
    assert cluster_counts == {"records": total + duplicates, "distinct": total,
                              "duplicates": duplicates, "through": figures["numbers"] - 1,
                              "missing": []}, (cluster_counts, figures)
    verdicts = judged_windows(bootstrap, audit_topic, topic_name, tmp_path / "r.db")
    print(json.dumps({"windows": verdicts}))
    assert verdicts and set(verdicts.values()) == {"complete"}, verdicts
