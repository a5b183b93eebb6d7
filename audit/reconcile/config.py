"""The reconciler's configuration: every setting declared once (``SETTINGS``, ``OWNER_SETTINGS``),
parsed and documented by the contract's settings machinery (``python -m audit.reconcile.config``
prints the reference, docs/reconcile-config.md). Unknown keys are errors; ``docket-audit
validate --config FILE`` checks a file and exits 78 with the key path and a hint.

Tables the declarations do not cover: ``[[owners]]`` (topic patterns → owner and channels, the
first match routes a data alert) and ``[channels.NAME]`` (one table per delivery channel; the
alerts package validates its keys).
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audit.contract.record import PRODUCER_TIER
from docket_common.kafka_security import KafkaSecurity
from docket_common.kafka_security import check_settings as check_security
from docket_common.kafka_security import settings as security_settings
from docket_common.names import AUDIT_TOPIC, RECONCILE_GROUP
from docket_common.settings import (
    ConfigError,
    Setting,
    host_port,
    load_toml,
    parse_sections,
    parse_table,
    parse_tables,
    reference_row,
    reference_table,
)
from docket_common.window import window_setting

from .channel_settings import parse as parse_channel

MINUTE_MS = 60_000

SETTINGS: tuple[Setting, ...] = (
    Setting("reconcile.bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers of "
            "the cluster holding the audit topic (`--bootstrap-servers` overrides it)."),
    Setting("reconcile.audit_topic", str, AUDIT_TOPIC, "The audit topic every tier writes to."),
    Setting("reconcile.group_id", str, RECONCILE_GROUP, "Consumer group under which the "
            "reconciler commits the offsets it has applied (for lag monitoring; the offsets it "
            "resumes from are the ones stored in its database)."),
    *security_settings("reconcile"),
    Setting("reconcile.librdkafka_options", dict, {}, "librdkafka properties passed to the "
            "consumer as they are, e.g. `\"fetch.max.bytes\" = 52428800`. Security goes in "
            "the `reconcile.security_protocol` … keys above (docs/security.md)."),
    Setting("reconcile.evaluate_interval_ms", int, MINUTE_MS, "How often windows are evaluated "
            "and alerts raised or resolved: each time once the audit topic is read to the end it "
            "had when the evaluation fell due (after 10 minutes behind, anyway).",
            minimum=1000),
    Setting("reconcile.deliver_interval_ms", int, 5000, "How often due alert notifications are "
            "sent (a channel that is down never delays the evaluation).", minimum=100),
    Setting("reconcile.listen", str, "127.0.0.1:9465", "Address (HOST:PORT) of `/metrics`, the "
            "reconciler's Prometheus metrics (docs/telemetry.md). Empty: no metrics server."),
    window_setting("windows.window_ms"),
    Setting("windows.grace_ms", int, 30 * MINUTE_MS, "After a window ends, how long it stays "
            "`pending` (late events, the agents' next emission, the jobs' next batches) before "
            "a shortfall is called loss.", minimum=0),
    Setting("windows.final_ms", int, 60 * MINUTE_MS, "After a window ends, when its verdict "
            "becomes final; a change after that is kept as a revision.", minimum=0),
    Setting("windows.settle_ms", int, MINUTE_MS, "For a tier that publishes no `caught_up` "
            "marks (docs/reconcile.md, \"Caught up\"): its silence about an origin counts as "
            "zero only once its progress arrived this long after the producer's report did; "
            "before that the window is `unknown` for it.", minimum=0),
    Setting("windows.tiers", list, [], "The order the tiers are shown in, from `producer` "
            "(each Kafka cluster, then `warehouse`). Empty: the tiers seen, `producer` first, "
            "`warehouse` last. What feeds each tier is `[tiers.NAME] fed_by`."),
    Setting("alerts.lag_ms", int, 30 * MINUTE_MS, "`audit_lag` when a tier's newest progress "
            "record arrived longer ago than this (by the broker's append time, or this "
            "reconciler's clock when it read it; never the job's own clock).", minimum=1000),
    Setting("alerts.silent_ms", int, 30 * MINUTE_MS, "`silent_producer` when an origin's newest "
            "producer record (agents send heartbeats every interval) arrived longer ago than "
            "this (measured as `alerts.lag_ms` is: never by the agent's clock).", minimum=1000),
    Setting("alerts.clock_skew_ms", int, 2 * MINUTE_MS, "`clock_skew` (a low-severity health "
            "condition, never a loss) when an origin's clock is further than this from the "
            "broker's, measured on its audit records (the audit topic must be stamped "
            "`LogAppendTime`).", minimum=1000),
    Setting("alerts.default_channels", list, [], "Channels of a data alert whose topic matches "
            "no `[[owners]]` entry."),
    Setting("alerts.health_channels", list, [], "Channels of the audit-health alerts "
            "(`audit_lag`, `silent_producer`, `clock_skew`). Empty: `alerts.default_channels`."),
)

TIER_SETTINGS: tuple[Setting, ...] = (
    Setting("fed_by", list, None, "The tiers this tier is fed by: `[\"producer\"]` for a "
            "cluster the agents write to, the local clusters a mirror copies for an aggregate "
            "cluster, the cluster a warehouse lands. The tier is judged on that hop "
            "(docs/topology.md). A tier not declared is fed by the producer.", required=True),
)

OWNER_SETTINGS: tuple[Setting, ...] = (
    Setting("topics", list, None, "Topic patterns (shell globs, e.g. `payments.*`) this entry "
            "routes.", required=True),
    Setting("owner", str, None, "Who owns these topics; named in the alert.", required=True),
    Setting("channels", list, [], "Channels the owner's data alerts go to."),
)


@dataclass(frozen=True)
class Owner:
    topics: list[str]
    owner: str
    channels: list[str]

    def matches(self, topic: str) -> bool:
        return any(fnmatch.fnmatchcase(topic, p) for p in self.topics)


@dataclass
class ReconcileConfig:
    values: dict[str, Any]
    owners: list[Owner] = field(default_factory=list)
    channels: dict[str, dict] = field(default_factory=dict)   # name → its raw table
    graph: dict[str, tuple[str, ...]] = field(default_factory=dict)  # tier → its fed_by

    def __getitem__(self, key: str):
        return self.values[key]

    @property
    def security(self) -> KafkaSecurity:
        """How the reconciler's consumer authenticates (``reconcile.security_protocol`` …)."""
        return KafkaSecurity.from_values(self.values, "reconcile")

    def route(self, topic: str | None) -> tuple[str | None, list[str]]:
        """(owner, channels) of an alert about ``topic`` (None: an audit-health alert)."""
        if topic is None:
            return None, (self["alerts.health_channels"] or self["alerts.default_channels"])
        for o in self.owners:
            if o.matches(topic):
                return o.owner, o.channels
        return None, self["alerts.default_channels"]


def parse(raw: dict) -> ReconcileConfig:
    values = parse_sections(raw, SETTINGS, other_sections=("owners", "channels", "tiers"))
    owners = _parse_owners(raw.get("owners", []))
    channels = raw.get("channels", {})
    if not isinstance(channels, dict) or not all(isinstance(t, dict) for t in channels.values()):
        raise ConfigError("channels", "expected one table per channel, [channels.NAME]",
                          hint='e.g. [channels.ops] with type = "webhook" and url = "..."')
    _check_channels(channels)
    named = [("alerts.default_channels", values["alerts.default_channels"]),
             ("alerts.health_channels", values["alerts.health_channels"])]
    named += [(f"owners[{i}].channels", o.channels) for i, o in enumerate(owners)]
    for path, names in named:
        for name in names:
            if name not in channels:
                raise ConfigError(path, f"channel {name!r} is not defined",
                                  hint=f"add a [channels.{name}] table, or use one of: "
                                  f"{', '.join(sorted(channels)) or '(none defined)'}")
    # The files are checked where a Kafka client is made (the reconciler, `validate`): the
    # dashboard reads this configuration without the reconciler's credentials.
    check_security(values, "reconcile", "reconcile.librdkafka_options", files=False)
    listen = values["reconcile.listen"]
    if listen:
        if host_port(listen) is None:
            raise ConfigError("reconcile.listen", f"expected HOST:PORT, found {listen!r}",
                              hint='e.g. "127.0.0.1:9465", or "" for no metrics server')
    tiers = values["windows.tiers"]
    if tiers and tiers[0] != PRODUCER_TIER:
        raise ConfigError("windows.tiers", f"the graph starts at {PRODUCER_TIER!r}, found "
                          f"{tiers[0]!r}", hint='e.g. ["producer", "kafka-local", "warehouse"]')
    if len(set(tiers)) != len(tiers):
        raise ConfigError("windows.tiers", "a tier is named twice")
    if values["windows.final_ms"] < values["windows.grace_ms"]:
        raise ConfigError("windows.final_ms", "a window cannot be final before its grace ends",
                          hint="keep final_ms >= grace_ms")
    return ReconcileConfig(values, owners, dict(channels), _parse_graph(raw.get("tiers", {})))


def _parse_graph(raw) -> dict[str, tuple[str, ...]]:
    """``[tiers.NAME] fed_by = [...]``: tier → the tiers it is fed by. Every name fed from is
    the producer or a declared tier, and the graph has no cycle."""
    if not isinstance(raw, dict) or not all(isinstance(t, dict) for t in raw.values()):
        raise ConfigError("tiers", "expected one table per tier, [tiers.NAME]",
                          hint='e.g. [tiers.aggregate] with fed_by = ["local"]')
    graph: dict[str, tuple[str, ...]] = {}
    for name, table in raw.items():
        where = f"tiers.{name}"
        if name == PRODUCER_TIER:
            raise ConfigError(where, "the producer is fed by nothing; it cannot be declared")
        fed_by = parse_table(table, TIER_SETTINGS, where, "a tier")["fed_by"]
        if not fed_by or not all(isinstance(f, str) and f for f in fed_by):
            raise ConfigError(f"{where}.fed_by", "expected a list of tier names",
                              hint='e.g. fed_by = ["producer"]')
        if len(set(fed_by)) != len(fed_by):
            raise ConfigError(f"{where}.fed_by", "a tier is named twice")
        graph[name] = tuple(fed_by)
    for name, fed_by in graph.items():
        for f in fed_by:
            if f != PRODUCER_TIER and f not in graph:
                raise ConfigError(f"tiers.{name}.fed_by", f"tier {f!r} is not declared",
                                  hint=f"declare it with [tiers.{f}] and its fed_by, or use "
                                  f"one of: {', '.join(sorted({PRODUCER_TIER, *graph}))}")
        if PRODUCER_TIER in fed_by and len(fed_by) > 1:
            raise ConfigError(f"tiers.{name}.fed_by", "a tier fed by the producer is fed by "
                              "nothing else", hint='fed_by = ["producer"]')
    for name in graph:                                   # a cycle: a tier upstream of itself
        seen, todo = set(), list(graph[name])
        while todo:
            f = todo.pop()
            if f == name:
                raise ConfigError(f"tiers.{name}.fed_by", "the tier feeds itself (a cycle)",
                                  hint="every chain of fed_by ends at the producer")
            if f not in seen and f != PRODUCER_TIER:
                seen.add(f)
                todo.extend(graph[f])
    return graph


def _parse_owners(raw) -> list[Owner]:
    return [Owner(**vals) for vals in parse_tables(
        raw, "owners", OWNER_SETTINGS, "an owner",
        hint='write each as [[owners]] with topics = ["app.*"] and owner')]


def _check_channels(channels: dict) -> None:
    """Each channel's table, checked against the channels' declarations (key paths
    ``channels.NAME.key``)."""
    for name, table in channels.items():
        parse_channel(name, table)


def load(path: str | Path) -> ReconcileConfig:
    return parse(load_toml(path))


def reference_markdown() -> str:
    """docs/reconcile-config.md, generated from the declarations."""
    lines = ["# Reconciler configuration reference", "",
             "Generated from `audit/reconcile/config.py` by `python -m audit.reconcile.config`; "
             "do not edit by hand.",
             "The file is TOML. Unknown keys are errors; `docket-audit validate --config FILE` "
             "checks a file and exits 78 with the key path and a hint when it is wrong.", ""]
    lines += reference_table(SETTINGS)
    lines += ["", "## [[owners]]", "", "One block per owner; the first whose topics match "
              "routes a data alert.", "", "| key | type | default | meaning |",
              "|---|---|---|---|"]
    lines += [reference_row(s.key, s) for s in OWNER_SETTINGS]
    lines += ["", "## [tiers.NAME]", "", "One table per tier fed by other tiers than the "
              "producer (docs/topology.md); the tiers not declared are fed by the producer.", "",
              "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [reference_row(s.key, s) for s in TIER_SETTINGS]
    lines += ["", "## [channels.NAME]", "", "One table per delivery channel, named by the "
              "owners' and alerts' `channels` lists; its keys depend on its `type` "
              "(`webhook`, `email`, `alertmanager`): see docs/alerts.md.", ""]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
