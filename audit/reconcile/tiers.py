"""The tier graph, in one place: which tiers count a topic and in what order, what feeds each
(the ``[tiers.*]`` tables' ``fed_by``), and how a hop is named. The verdicts, the alerts and
the dashboard all take it from here, so a loss is located at the same hop in each of them.

- ``tier_order``: a topic's tiers, the configured ones first in their order.
- ``feeders_of``: what feeds each tier among those that count the topic (a declared feeder
  that does not is skipped for its own feeders).
- ``feeders_first``: an order in which every tier comes after the tiers feeding it.
- ``hop_label``: ``kafka-local → aggregate``, ``dc1 + dc2 → aggregate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from audit.contract.record import PRODUCER_TIER, WAREHOUSE_TIER


def tier_order(tiers_seen: set[str], configured: list[str]) -> list[str]:
    """The tier graph of a topic: the configured tiers that report on it, in their order, then
    tiers seen but not configured; by default ``producer`` first, ``warehouse`` last, the
    clusters between, by name. A tier is judged only on the topics it counts."""
    order = [t for t in configured if t == PRODUCER_TIER or t in tiers_seen] or [PRODUCER_TIER]
    rest = sorted(t for t in tiers_seen if t not in order and t != WAREHOUSE_TIER)
    order += rest
    if WAREHOUSE_TIER in tiers_seen and WAREHOUSE_TIER not in order:
        order.append(WAREHOUSE_TIER)
    return order


def feeders_of(tiers: list[str], graph: dict[str, tuple[str, ...]]
               ) -> dict[str, tuple[str, ...]]:
    """tier → the tiers among ``tiers`` that feed it, as ``graph`` (tier → its declared
    ``fed_by``) says: a declared feeder that does not count the topic is skipped for its own
    feeders; a tier not declared is fed by the producer."""
    def resolve(tier: str, seen: frozenset) -> tuple[str, ...]:
        out: list[str] = []
        for f in graph.get(tier, (PRODUCER_TIER,)):
            if f == PRODUCER_TIER or f in tiers:
                found: tuple[str, ...] = (f,)
            elif f in seen:                              # config refuses cycles; be safe
                found = (PRODUCER_TIER,)
            else:
                found = resolve(f, seen | {f})
            out.extend(x for x in found if x not in out)
        return tuple(out) or (PRODUCER_TIER,)
    return {t: resolve(t, frozenset({t})) for t in tiers if t != PRODUCER_TIER}


def feeders_first(tiers: list[str], feeders: Mapping[str, Sequence[str] | None]) -> list[str]:
    """``tiers`` ordered so that every tier comes after the tiers feeding it."""
    out: list[str] = []

    def visit(tier: str, path: frozenset) -> None:
        if tier in out or tier in path:
            return
        for f in feeders.get(tier) or ():
            visit(f, path | {tier})
        out.append(tier)
    for t in tiers:
        visit(t, frozenset())
    return out


def hop_label(tier: str, fed_by: Sequence[str] | None) -> str | None:
    """``kafka-local → kafka-aggregate``, ``dc1 + dc2 → aggregate``: the hop whose far end is
    ``tier`` (None when what feeds it is not known)."""
    return None if fed_by is None else f"{' + '.join(fed_by)} → {tier}"
