"""Create and check the topics docket uses: data topics and the audit topic.

``ensure_topics`` is idempotent: a topic that exists with the asked partition count and
replication factor is left alone; one that differs raises :class:`TopicConflict` instead of being
silently reused, because a wrong partition count changes ordering and a wrong replication factor
changes durability.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from docket_common.names import AUDIT_TOPIC

from .errors import BrokerError, TopicConflict

# Audit records are cumulative and small; keep them long enough to replay a month of windows.
# The broker stamps each one when it appends it (``LogAppendTime``): the reconciler measures
# audit lag, silence and each producer's clock offset against that one clock, never against
# the time a sender's clock wrote.
AUDIT_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(30 * 24 * 3600 * 1000),
                      "message.timestamp.type": "LogAppendTime"}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 3
    replication_factor: int = -1   # -1: the cluster's default.replication.factor
    config: dict[str, str] = field(default_factory=dict)


def admin_client(bootstrap_servers: str, extra: dict | None = None) -> AdminClient:
    quiet = logging.getLogger("docket.broker.librdkafka")
    quiet.setLevel(logging.CRITICAL)
    return AdminClient({"bootstrap.servers": bootstrap_servers, **(extra or {})}, logger=quiet)


def describe(admin: AdminClient, name: str, timeout_s: float = 10) -> tuple[int, int] | None:
    """(partitions, replication factor) of an existing topic, or None when it does not exist.

    Lists all topics rather than asking for this one: a metadata request naming a topic makes
    a broker with ``auto.create.topics.enable`` create it with default settings.
    """
    md = admin.list_topics(timeout=timeout_s).topics.get(name)
    if md is None:
        return None
    if md.error is not None and md.error.code() != KafkaError.LEADER_NOT_AVAILABLE:
        raise BrokerError(f"cannot describe topic {name!r}: {md.error.str()}")
    replicas = min((len(p.replicas) for p in md.partitions.values()), default=0)
    return len(md.partitions), replicas


def ensure_topics(
    bootstrap_servers: str, specs: list[TopicSpec], timeout_s: float = 30,
    client: dict | None = None,
) -> list[str]:
    """Create the topics that are missing; return the names created. Checks the ones that exist.
    ``client``: further librdkafka properties (a secured cluster's, ``broker.security``)."""
    admin = admin_client(bootstrap_servers, client)
    brokers = len(admin.list_topics(timeout=timeout_s).brokers)
    created: list[str] = []
    to_create = []
    for spec in specs:
        current = describe(admin, spec.name, timeout_s)
        if current is None:
            to_create.append(spec)
            continue
        _check_matches(spec, current)
    if to_create:
        futures = admin.create_topics(
            [NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor,
                      config=dict(s.config)) for s in to_create],
            operation_timeout=timeout_s, request_timeout=timeout_s,
        )
        for name, fut in futures.items():
            try:
                fut.result()
                created.append(name)
            except KafkaException as exc:
                err = exc.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue   # created by someone else meanwhile; checked below
                spec = next(s for s in to_create if s.name == name)
                hint = ""
                if spec.replication_factor > brokers:
                    hint = f"the cluster has {brokers} broker(s); lower --replication-factor"
                raise BrokerError(
                    f"creating topic {name!r} failed: {err.str()}", hint=hint
                ) from exc
    _wait_visible(admin, [s.name for s in specs], timeout_s)
    return created


def _check_matches(spec: TopicSpec, current: tuple[int, int]) -> None:
    partitions, replicas = current
    if partitions != spec.partitions or (
        spec.replication_factor != -1 and replicas != spec.replication_factor
    ):
        raise TopicConflict(
            f"topic {spec.name!r} exists with {partitions} partition(s) and replication factor "
            f"{replicas}; asked for {spec.partitions} and "
            f"{'the default' if spec.replication_factor == -1 else spec.replication_factor}",
            hint="use the existing settings, or delete the topic first if its data may go",
        )


def _wait_visible(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Topic creation is asynchronous in metadata; wait until every partition has a leader."""
    deadline = time.monotonic() + timeout_s
    while True:
        missing = []
        topics = admin.list_topics(timeout=timeout_s).topics
        for name in names:
            md = topics.get(name)
            if md is None or md.error is not None or not md.partitions or any(
                p.leader < 0 for p in md.partitions.values()
            ):
                missing.append(name)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise BrokerError(f"topic(s) {missing} have no leader after {timeout_s:.0f}s")
        time.sleep(0.2)


def ensure_audit_topic(bootstrap_servers: str, name: str = AUDIT_TOPIC, partitions: int = 3,
                       replication_factor: int = -1, client: dict | None = None) -> bool:
    """Create the audit topic if missing; True when it was created now."""
    spec = TopicSpec(name, partitions, replication_factor, AUDIT_TOPIC_CONFIG)
    return bool(ensure_topics(bootstrap_servers, [spec], client=client))


def list_topics(bootstrap_servers: str, timeout_s: float = 10,
                client: dict | None = None) -> dict[str, tuple[int, int]]:
    """Every topic but Kafka's own: (partitions, replication factor). ``client``: as
    ``ensure_topics``'."""
    admin = admin_client(bootstrap_servers, client)
    md = admin.list_topics(timeout=timeout_s)
    out = {}
    for name, t in md.topics.items():
        if name.startswith("__"):
            continue
        replicas = min((len(p.replicas) for p in t.partitions.values()), default=0)
        out[name] = (len(t.partitions), replicas)
    return dict(sorted(out.items()))
