"""The completeness watermark of a topic at a tier, read from the reconciler's database.

Shown by ``docket-audit watermark`` (``commands``) and by the dashboard, which must not import
the command-line modules (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from .store import Store


def watermark(store: Store, topic: str, tier: str) -> int | None:
    """The end of the longest run of consecutive windows, from the topic's first, that are
    final, complete and whose checksum does not disagree at ``tier`` (None: not even the first
    is). A window nobody reported on (not even a producer's heartbeat) ends the run."""
    mark = None
    for start, ms, state, final, checksum in store.tier_runs(topic, tier):
        if (mark is not None and start != mark) or not final or state != "complete" or \
                checksum == "mismatch":
            break
        mark = start + ms
    return mark
