"""The demo's topology as it starts it (``demo.run``), without starting it: two clusters on
ports of their own, MirrorMaker 2 copying the data and the audit topic from local to
aggregate, a count job per cluster, the warehouse landing from the aggregate, the reconciler
on the aggregate with the tier graph; and what the mirror drill computes and waits for."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from audit.cli import _parser as audit_parser
from audit.jobs.settings import job_values
from audit.reconcile import config as rconfig
from audit.reconcile.tiers import feeders_of
from broker.cluster import LocalCluster
from demo.run import (
    EXPECTED,
    TIERS,
    TOPICS,
    Expected,
    Ports,
    job_commands,
    lost_by_window,
    mirror_spec,
    ranges,
    reconcile_config,
)
from docket_common.names import AUDIT_TOPIC

CLUSTERS = {"local": "127.0.0.1:19092", "aggregate": "127.0.0.1:19094"}


def _cluster_ports(tmp_path, first: int) -> set[int]:
    """The ports a 1-broker cluster on ``first`` binds, as ``broker.cluster`` lays it out."""
    layout = LocalCluster(tmp_path / f"c{first}")._plan(1, first)
    return {p for n in layout.nodes for p in (n.port, n.controller_port)}


@pytest.mark.parametrize("base", [None, 20000])
def test_each_cluster_and_part_has_a_port_of_its_own(tmp_path, base):
    ports = Ports.plan(base)
    first = 9092 if base is None else base
    assert (ports.cluster("local") or 9092, ports.cluster("aggregate")) == (first, first + 2)
    kafka = _cluster_ports(tmp_path, first) | _cluster_ports(tmp_path, first + 2)
    assert kafka <= set(ports.all())                     # every port a broker binds is planned
    assert len(set(ports.all())) == len(ports.all()) == 4 + 6
    assert ports.dashboard == (8642 if base is None else base + 12)


def test_two_demos_18_base_ports_apart_share_no_port():
    for gap in (18, 20, 100):
        assert not set(Ports.plan(20000).all()) & set(Ports.plan(20000 + gap).all()), gap
    assert set(Ports.plan(20000).all()) & set(Ports.plan(20017).all())   # the documented bound
    assert max(Ports.plan(20000).all()) == 20017


def test_the_reconciler_reads_the_aggregate_with_the_tier_graph(tmp_path):
    cfg = rconfig.load(reconcile_config(tmp_path, CLUSTERS["aggregate"], Ports.plan(20000)))
    assert cfg["reconcile.bootstrap_servers"] == CLUSTERS["aggregate"]
    assert cfg["windows.tiers"] == list(TIERS) == ["producer", "kafka-local",
                                                   "kafka-aggregate", "warehouse"]
    assert feeders_of(list(TIERS), cfg.graph) == {"kafka-local": ("producer",),
                                                  "kafka-aggregate": ("kafka-local",),
                                                  "warehouse": ("kafka-aggregate",)}


def _job(argv: list[str]) -> SimpleNamespace:
    """A job's command line as the job takes it: its settings (flags over defaults, checked)
    by their names, with its command and cluster."""
    args = audit_parser().parse_args(argv)
    values, _security = job_values(args)
    return SimpleNamespace(command=args.command, cluster=getattr(args, "cluster", None),
                           **{key.split(".", 1)[1]: v for key, v in values.items()})


def test_a_count_job_on_each_cluster_and_the_warehouse_lands_from_the_aggregate(tmp_path):
    jobs = job_commands(tmp_path, CLUSTERS)
    assert set(jobs) == {"count-local", "count-aggregate", "land"}
    parsed = {name: _job(cmd[1:]) for name, cmd in jobs.items()}
    local, aggregate, land = parsed["count-local"], parsed["count-aggregate"], parsed["land"]
    assert (local.cluster, local.bootstrap_servers, local.mirror_target) == \
        ("kafka-local", CLUSTERS["local"], None)
    assert (aggregate.cluster, aggregate.bootstrap_servers, aggregate.mirror_target) == \
        ("kafka-aggregate", CLUSTERS["aggregate"], "aggregate")
    assert (land.command, land.bootstrap_servers, land.mirror_target) == \
        ("land", CLUSTERS["aggregate"], "aggregate")
    assert local.checkpoint_dir != aggregate.checkpoint_dir
    assert all(p.window_ms == 60_000 and p.audit_bootstrap_servers is None
               for p in parsed.values())                 # each writes its counts where it reads
    for topic in TOPICS:
        assert all(re.fullmatch(p.topics, topic) for p in parsed.values())


def test_the_mirror_copies_the_data_topics_and_the_audit_topic_from_local_to_aggregate():
    spec = mirror_spec(CLUSTERS)
    assert (spec.source, spec.target, spec.source_bootstrap, spec.target_bootstrap) == \
        ("local", "aggregate", CLUSTERS["local"], CLUSTERS["aggregate"])
    assert spec.audit_topic == AUDIT_TOPIC
    for topic in (*TOPICS, AUDIT_TOPIC):
        assert re.fullmatch(spec.pattern, topic), topic
    assert not re.fullmatch(spec.pattern, "app.eventsX")
    assert "local->aggregate.enabled = true" in spec.properties_text()


def _loss(**over) -> dict:
    alert = {"event": "firing", "kind": "loss", "tier": "kafka-aggregate", "origin": "web-2",
             "detail": {"hop": "kafka-local → kafka-aggregate", "missing": 3}}
    alert.update(over)
    return alert


def test_the_mirror_drill_waits_for_a_loss_of_web_2_at_the_hop_into_the_aggregate():
    wanted = EXPECTED["mirror"]
    assert wanted.met_by(_loss())
    assert not wanted.met_by(_loss(event="resolved"))
    assert not wanted.met_by(_loss(origin="web-1"))
    assert not wanted.met_by(_loss(tier="kafka-local"))
    assert not wanted.met_by(_loss(tier="warehouse", detail={"hop": "kafka-aggregate → "
                                                                    "warehouse"}))
    assert not wanted.met_by(_loss(detail={"missing": 3}))          # no hop: not this loss
    assert not wanted.met_by("not json")
    warehouse = EXPECTED["delete-records"]
    assert warehouse.met_by(_loss(tier="warehouse", origin="web-1",
                                  detail={"hop": "kafka-aggregate → warehouse"}))
    assert EXPECTED["delete-log"] == Expected("loss", "producer", "web-3")
    assert EXPECTED["delete-log"].met_by(_loss(tier="producer", origin="web-3", detail={}))


def test_what_the_mirror_did_not_copy_is_lost_in_the_windows_of_its_timestamps():
    held = [(("web-2", "i1", n), 60_000 * 7 + 20_000 + 1000 * (n - 100)) for n in range(100, 160)]
    copied = {("web-2", "i1", n) for n in range(100, 110)} | {("web-2", "i2", 120)}
    lost = lost_by_window(held, copied)
    assert lost == {420_000: list(range(110, 140)), 480_000: list(range(140, 160))}
    assert ranges([n for ns in lost.values() for n in ns]) == [[110, 159]]
    assert ranges([5, 3, 4, 9, 11, 10, 11]) == [[3, 5], [9, 11]]
    assert ranges([]) == []


def test_the_record_deletion_drill_is_met_by_the_grouped_loss_at_the_warehouse_hop():
    """The drill deletes records of every host before the warehouse job reads them: the loss
    is one alert for several origins at the hop kafka-aggregate → warehouse, and must meet the
    drill's expectation (``make soak`` waited 600 s for it while it had come, its hop only
    inside the worst member's figures)."""
    from audit.reconcile.alerts.lifecycle import group_text
    from demo.run import EXPECTED

    want = EXPECTED["delete-records"]
    hop = "kafka-aggregate → warehouse"
    at = f"app.events window 2026-12-04T15:17:00Z hop {hop}"
    members = {o: (f"{n} of 700 events missing at {at} origin {o}",
                   {"missing": n, "hop": hop, "expected": 700})
               for o, n in (("web-1", 577), ("web-2", 600), ("web-3", 618))}
    _summary, detail = group_text("loss", at, members, None)
    alert = {"event": "firing", "kind": "loss", "tier": "warehouse", "origin": None,
             "detail": detail}
    assert want.met_by(alert)
    assert not want.met_by({**alert, "tier": "kafka-aggregate"})
