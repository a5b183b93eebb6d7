"""Network faults with a fleet (tests/fleetkit.py): ten agents, each in a network namespace of
its own with its own writer, and a 3-broker cluster whose brokers each have theirs, through
200 ms of delay with 5 % loss, one broker partitioned away for 60 s, and every broker out of
reach for 60 s then back at once. Every id arrives, duplicates stay within what the agents
sent again, every audit tier is complete. The soak run prints one JSON line of figures; the
short test checks the fault tools themselves, so CI notices when the harness breaks."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from audit.contract.collect import read_audit_topic
from broker.admin import admin_client
from tests.agentkit import consume_counts
from tests.auditkit import AuditJob, judged_windows
from tests.fleetkit import (
    Fleet,
    Network,
    broker_host,
    connect_ms,
    first_id,
    inside,
    least_connect_ms,
    netdelay_binary,
    unavailable,
)
from tests.integration.test_agent_end_to_end import parse_id

BUILD = Path(__file__).resolve().parents[2] / "build" / "fleet"
AGENTS = int(os.environ.get("DOCKET_FLEET_AGENTS", "10"))
RATE = 250                      # lines/s per agent
LEAD_S, AFTER_S = 5, 15
FAULT_S = int(os.environ.get("DOCKET_FLEET_FAULT_S", "60"))   # shorter to try the harness
DELAY_MS, LOSS = 200, 0.05
CATCH_UP_TIMEOUT_S = 300


def harness() -> Path:
    reason = unavailable(BUILD)
    if reason:
        pytest.skip(reason)
    return netdelay_binary(BUILD)


# -- the tools --------------------------------------------------------------------------------
class Listener:
    """A TCP port accepting (and closing) connections, and a UDP port counting datagrams, both
    bound inside namespace ``ns``."""

    def __init__(self, ns: str, host: str, port: int):
        with inside(ns):
            self.tcp = socket.create_server((host, port), backlog=128)
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.udp.bind((host, port))
        self.udp.settimeout(0.2)
        self.datagrams = 0
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._count, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                self.tcp.accept()[0].close()
            except OSError:
                return

    def _count(self) -> None:
        while not self.closed:
            try:
                self.udp.recv(64)
                self.datagrams += 1
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self.closed = True
        self.tcp.close()
        self.udp.close()


def test_the_fault_tools_delay_drop_partition_and_heal():
    """Two "brokers" (plain listeners) and one "agent", no Kafka: each fault measured from the
    agent's namespace, and gone after ``heal``."""
    net = Network(brokers=2, agents=1, netdelay=harness()).create()
    listeners = []
    try:
        agent = net.agents[0]
        one, two = broker_host(1), broker_host(2)
        listeners = [Listener(net.brokers[0], one, 9000), Listener(net.brokers[1], two, 9000)]
        before = least_connect_ms(agent, one, 9000)
        assert before is not None and before < 100, before

        net.delay(DELAY_MS, 0)
        delayed = least_connect_ms(agent, one, 9000)
        healed = net.heal()
        after = least_connect_ms(agent, one, 9000)
        print(f"connect: {before:.1f} ms, {delayed} ms delayed, {after} ms healed; {healed}")
        assert delayed is not None and delayed >= DELAY_MS, delayed
        assert net.delayed_packets(healed["held"]) >= 5, healed
        assert after is not None and after < 100, after

        net.delay(0, 0.3)
        with inside(agent):
            sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for n in range(300):
            sender.sendto(b"%d" % n, (one, 9000))
            time.sleep(0.001)
        time.sleep(0.5)
        dropped = net.heal()["dropped_packets"]
        print(f"300 datagrams at 30 % loss: {listeners[0].datagrams} arrived, {dropped} dropped")
        assert 0 < dropped and listeners[0].datagrams + dropped == 300

        net.partition(1)
        cut, other = connect_ms(agent, one, 9000), connect_ms(agent, two, 9000)
        net.heal()
        assert cut is None and other is not None, (cut, other)
        assert connect_ms(agent, one, 9000) is not None

        net.all_down()
        cut = [connect_ms(agent, host, 9000) for host in (one, two)]
        net.heal()
        assert cut == [None, None], cut
        assert connect_ms(agent, two, 9000) is not None
    finally:
        for listener in listeners:
            listener.close()
        net.destroy()
    assert not any(Path("/run/netns", ns).exists() for ns in [net.hub, *net.members])


# -- the fleet --------------------------------------------------------------------------------
@pytest.mark.soak
@pytest.mark.timeout(3600)
def test_soak_a_fleet_through_delay_and_loss_a_partition_and_every_broker_away(tmp_path):
    """``make soak``: the three scenarios in sequence on one fleet, each with writers of its
    own ids. Per scenario: 0 of its ids lost, its duplicates, the catch-up after the heal
    (until every agent has had acknowledged every event it had accepted at the heal), the
    agents' CPU during the fault and the brokers' during the catch-up, and the proof that the
    fault happened. Then every tier complete. One JSON line; assertions after it."""
    tool = harness()
    topic, audit_topic = f"fleet.{uuid.uuid4().hex[:8]}", f"fleet.audit.{uuid.uuid4().hex[:8]}"
    fleet = Fleet(tmp_path, AGENTS, tool)
    per_agent = RATE * (LEAD_S + FAULT_S + AFTER_S)
    began = time.monotonic()
    with fleet.running(topic, audit_topic):
        scenarios = {
            "delay_loss": scenario(fleet, 0, per_agent, lambda: fleet.net.delay(DELAY_MS, LOSS),
                                   lambda: delay_probe(fleet)),
            "one_broker_partitioned": scenario(fleet, 1, per_agent,
                                               lambda: fleet.net.partition(2),
                                               lambda: partition_probe(fleet, 2)),
            "all_brokers_away": scenario(fleet, 2, per_agent, fleet.net.all_down,
                                         lambda: outage_probe(fleet)),
        }
        final = fleet.statuses()
        retried = [st["totals"]["retried_events"] for st in final]
        codes = fleet.stop_agents()
        total = len(scenarios) * AGENTS * per_agent
        counts = consume_counts(fleet.bootstrap, topic, total, 600, parse_id)
        tiers = audit_tiers(fleet, tmp_path, topic, audit_topic)
    summary = judge(scenarios, counts, per_agent, retried)
    summary.update(agents=AGENTS, events=total, seconds=round(time.monotonic() - began),
                   agent_exit_codes=codes, dropped_events=sum(st["dropped_events"]
                                                             for st in final),
                   tiers=tiers)
    print(json.dumps(summary))
    assert summary["lost"] == 0, summary
    assert summary["extra_ids"] == 0, summary
    assert not summary["over_bound"], summary
    assert codes == [0] * AGENTS and summary["dropped_events"] == 0, summary
    for name, s in scenarios.items():
        assert s["catch_up_s"] is not None, (name, s)
        assert s["fault_seen"], (name, s)
    # Delay and loss, or two of three brokers (replication 3, min.insync.replicas 2): the
    # cluster still takes every write, so every agent must go on delivering through the fault.
    for name in ("delay_loss", "one_broker_partitioned"):
        assert not scenarios[name]["stalled_agents"], (name, scenarios[name])
    assert tiers["windows"] and set(tiers["windows"].values()) == {"complete"}, tiers
    assert tiers["cluster_missing"] == 0 and tiers["cluster_distinct"] == total, tiers


def scenario(fleet: Fleet, phase: int, per_agent: int, fault, probe) -> dict:
    """Writers start, the fault ``LEAD_S`` later for ``FAULT_S``, ``probe`` halfway through and
    at its end (its ``fault_seen`` says the fault happened), then the heal, the catch-up, the
    rest of the writing, and every agent drained before the next scenario."""
    writers = fleet.write(phase, RATE, per_agent)
    lead, lead_cpu = time.monotonic(), sum(fleet.agent_cpu())
    time.sleep(LEAD_S)
    cpu = fleet.agent_cpu()
    lead_cpu = (sum(cpu) - lead_cpu) / (time.monotonic() - lead)
    fault()
    faulted = time.monotonic()
    time.sleep(FAULT_S / 2)
    seen = probe()
    sent = [st["totals"]["sent_events"] for st in fleet.statuses()]
    time.sleep(max(0.0, faulted + FAULT_S - time.monotonic()))
    seen.update({f"end_{k}": v for k, v in probe().items()})
    # an agent that had nothing acknowledged in the fault's second half (its writer wrote
    # 250 lines/s all along): stalled
    stalled = [i for i, (a, st) in enumerate(zip(sent, fleet.statuses(), strict=True))
               if st["totals"]["sent_events"] == a]
    agent_cpu = [b - a for a, b in zip(cpu, fleet.agent_cpu(), strict=True)]
    accepted = [st["totals"]["read_events"] for st in fleet.statuses()]
    broker_cpu = fleet.broker_cpu()
    healed = fleet.net.heal()
    catch_up = fleet.wait_sent(accepted, CATCH_UP_TIMEOUT_S)
    broker_cpu = fleet.broker_cpu() - broker_cpu
    for writer in writers:
        assert writer.wait(timeout=CATCH_UP_TIMEOUT_S) == 0
    written = [per_agent * (phase + 1)] * len(writers)       # each file holds every phase's
    drained = fleet.wait_sent(written, CATCH_UP_TIMEOUT_S)
    figures = {"catch_up_s": None if catch_up is None else round(catch_up, 2),
               "accepted_at_heal": sum(accepted),
               "agent_cpu_s": round(sum(agent_cpu), 2),
               "agent_cpu_s_before": round(lead_cpu * FAULT_S, 2),    # as long, no fault
               "agent_cpu_s_max": round(max(agent_cpu), 2),
               "broker_cpu_s_catch_up": round(broker_cpu, 2),
               "drained": drained is not None,
               "stalled_agents": stalled,
               "dropped_packets": healed["dropped_packets"],
               "delayed_packets": fleet.net.delayed_packets(healed["held"]), **seen}
    figures["fault_seen"] = fault_seen(figures)
    print(json.dumps({"scenario": phase, **figures}))
    return figures


def fault_seen(f: dict) -> bool:
    """Did the scenario's fault happen, by what the probes measured?"""
    if "connect_ms" in f:                                   # delay and loss
        return f["connect_ms"] is not None and f["connect_ms"] >= DELAY_MS \
            and f["delayed_packets"] > 0 and f["dropped_packets"] > 0
    if "brokers_listed" in f:                               # one broker partitioned
        return f["cut_off_connect"] is None and 2 not in f["end_brokers_listed"] \
            and f["dropped_packets"] > 0
    return f["end_unreachable_agents"] == AGENTS and f["end_waiting_events"] > 0 \
        and len(f["stalled_agents"]) == AGENTS and f["dropped_packets"] > 0


def delay_probe(fleet: Fleet) -> dict:
    took = least_connect_ms(fleet.net.agents[0], broker_host(1), 9092)
    return {"connect_ms": None if took is None else round(took, 1)}


def partition_probe(fleet: Fleet, k: int) -> dict:
    """The brokers a metadata request lists (from broker 1), and a connect to broker k."""
    listed = sorted(admin_client(broker_host(1) + ":9092").list_topics(timeout=10).brokers)
    return {"brokers_listed": listed,
            "cut_off_connect": connect_ms(fleet.net.agents[0], broker_host(k), 9091 + k)}


def outage_probe(fleet: Fleet) -> dict:
    """What the agents' status says: the cluster out of reach (``unreachable``: no answer to
    the drain's probe; ``all brokers down``: librdkafka closed every connection), events
    waiting in the pool."""
    statuses = fleet.statuses()
    answered = [st for st in statuses if st is not None]
    return {"unreachable_agents": sum(st["broker"]["state"] in ("unreachable", "all brokers down")
                                      for st in answered),
            "waiting_events": sum(st["backlog"]["events"] for st in answered),
            "status_unanswered": len(statuses) - len(answered)}


def judge(scenarios: dict, counts: Counter, per_agent: int, retried: list[float]) -> dict:
    """Lost and duplicates per scenario (by its ids), and per agent the duplicates of its ids
    against the events it sent again (no agent was killed: a copy can only come from a send
    the agent repeated)."""
    lost = dup = 0
    agent_dups = Counter()
    expected = set()
    for phase, figures in enumerate(scenarios.values()):
        f_lost = f_dup = 0
        for i in range(AGENTS):
            ids = range(first_id(phase, i), first_id(phase, i) + per_agent)
            expected.update(ids)
            missing = sum(1 for n in ids if counts.get(n, 0) == 0)
            copies = sum(counts[n] - 1 for n in ids if counts.get(n, 0) > 1)
            f_lost, f_dup = f_lost + missing, f_dup + copies
            agent_dups[i] += copies
        figures.update(lost=f_lost, duplicates=f_dup)
        lost, dup = lost + f_lost, dup + f_dup
    over = {i: (agent_dups[i], retried[i]) for i in range(AGENTS) if agent_dups[i] > retried[i]}
    return {"lost": lost, "duplicates": dup, "max_copies": max(counts.values(), default=0),
            "retried_events": sum(retried), "over_bound": over,
            "extra_ids": len(set(counts) - expected),
            "scenarios": scenarios}


def audit_tiers(fleet: Fleet, folder: Path, topic: str, audit_topic: str) -> dict:
    """The Spark count job once over the topic (the kafka-local tier), then the reconciler's
    verdict on each window at every tier (run by tests/faults/test_exactly_once.py's
    ``judged_windows``, its clock three hours ahead)."""
    job = AuditJob(["count", "--cluster", "kafka-local", "--bootstrap-servers", fleet.bootstrap,
                    "--audit-topic", audit_topic, "--topics", topic.replace(".", r"\."),
                    "--once", "--checkpoint-dir", str(folder / "ckpt")],
                   folder / "count.log").start()
    assert job.wait(900) == 0, job.log_text()
    state = read_audit_topic(fleet.bootstrap, audit_topic)
    cluster = [r for r in state.counts.values() if r.tier == "kafka-local"]
    ranges = [r for r in state.ranges.values() if r.tier == "kafka-local"]
    judged_windows(fleet.bootstrap, audit_topic, topic, folder / "reconcile.db")
    with sqlite3.connect(folder / "reconcile.db") as db:
        windows = {f"{tier} {start}": state for tier, start, state in db.execute(
            "SELECT tier, window_start, state FROM windows WHERE topic = ?", (topic,))}
    return {"cluster_records": sum(r.count for r in cluster),
            "cluster_distinct": sum(r.distinct for r in cluster),
            "cluster_duplicates": sum(r.duplicates for r in cluster),
            "cluster_origins": len({r.origin for r in ranges}),
            "cluster_missing": sum(r.missing_total for r in ranges),
            "windows": windows}
