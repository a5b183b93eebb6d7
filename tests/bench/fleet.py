"""A fleet's day of audit records, for the reconciler's and the dashboard's benchmarks: many
origins each writing a few topics, through the tiers producer → kafka-local → aggregate →
warehouse (a local cluster, a mirror to an aggregate cluster, a warehouse landed from it).

The shape (``Fleet``; the defaults are the fleet of the seed system's size): ``origins`` hosts,
``topics`` topics, each origin writing ``per_origin`` of them (origin i writes topics
``(i + k * stride) % topics``, so every topic has ``origins * per_origin / topics`` writers),
``windows`` ten-minute windows. One count record per (tier, origin, topic, window), in the order
the emitters send them (window by window; per tier, each emitter all it counted). Faults, placed
by a fixed hash so every run is the same:

- 1 in 1,000 (origin, window): ``LOST`` records of one of its topics lost at kafka-local (so
  short at every tier after it; a ``ranges`` record from each of the three names the numbers);
- 1 in 1,000 (origin, window): 12 copies added by the mirror (the aggregate and the warehouse
  count them; only the aggregate's hop added them);
- one (topic, window), ``WHOLE_LOSS``: the tail of the topic's partition lost at kafka-local for
  every origin writing to it (topics have one partition here): ``LOST`` records of each.

Each tier's job keeps up (a progress record per window). ``expected()`` says what the
reconciler must find.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from audit.contract.record import AuditRecord, Progress, Ranges

WINDOW_MS = 600_000
MIN = 60_000
T0 = 1_763_683_200_000                     # 2025-11-21T00:00:00Z
TIERS = ["producer", "kafka-local", "aggregate", "warehouse"]
GRAPH = {"kafka-local": {"fed_by": ["producer"]}, "aggregate": {"fed_by": ["kafka-local"]},
         "warehouse": {"fed_by": ["aggregate"]}}
EVENTS = 600                               # per origin, topic and window, about (~1 line/s)
LOST = 5


@dataclass(frozen=True)
class Fleet:
    origins: int = 20_000
    topics: int = 2_000
    per_origin: int = 5
    windows: int = 144

    @property
    def stride(self) -> int:
        return max(1, self.topics // self.per_origin)

    @property
    def whole_loss(self) -> tuple[int, int]:
        """(topic, window) whose partition's tail is lost for every writer."""
        return self.topics // 3, self.windows // 2

    def topics_of(self, origin: int) -> list[int]:
        return [(origin + k * self.stride) % self.topics for k in range(self.per_origin)]

    def writers(self, topic: int) -> list[int]:
        return [o for o in range(self.origins) if topic in self.topics_of(o)]

    def fault(self, origin: int, window: int) -> tuple[str, int] | None:
        """(``loss`` | ``duplicates``, which of the origin's topics) or None."""
        i = (origin * self.windows + window) * 7919 % 1000
        if i in (0, 1):
            return ("loss" if i == 0 else "duplicates"), (origin + window) % self.per_origin
        return None

    def records(self, windows: range | None = None) -> Iterator[AuditRecord | Ranges | Progress]:
        """Every record of ``windows`` (default: the day), in the order the emitters send them.
        Record numbers run per origin from the day's first window, whichever are asked for."""
        windows = range(self.windows) if windows is None else windows
        numbered = [0] * self.origins
        lost: dict[int, list[list[int]]] = {}
        whole_topic, whole_window = self.whole_loss
        for w in range(windows.stop):
            start = T0 + w * WINDOW_MS
            end = start + WINDOW_MS
            shown = w in windows
            # the producer's counts first (they number the records), then each job's
            shorts: dict[tuple[int, int], int] = {}          # (origin, topic) → lost
            copies: dict[tuple[int, int], int] = {}
            for o in range(self.origins):
                fault = self.fault(o, w)
                for k, t in enumerate(self.topics_of(o)):
                    n = EVENTS + (t * 31 + w * 17 + o) % 97
                    if fault == ("loss", k) or (t, w) == (whole_topic, whole_window):
                        first = numbered[o] + n - LOST        # the partition's tail
                        lost.setdefault(o, []).append([first, first + LOST - 1])
                        shorts[(o, t)] = LOST
                    elif fault == ("duplicates", k):
                        copies[(o, t)] = 12
                    numbered[o] += n
                    if shown:
                        yield self._count("producer", o, t, start, n, n, end + MIN)
            if not shown:
                continue
            for tier in TIERS[1:]:
                for o in range(self.origins):
                    for t in self.topics_of(o):
                        n = EVENTS + (t * 31 + w * 17 + o) % 97 - shorts.get((o, t), 0)
                        extra = copies.get((o, t), 0) if tier != "kafka-local" else 0
                        yield self._count(tier, o, t, start, n + extra, n, end + 2 * MIN)
                yield Progress(tier=tier, emitter=f"{tier}/count", batch_id=w,
                               input_rows_per_s=1e5, processed_rows_per_s=1e5,
                               batch_duration_ms=1000, offsets_behind=0,
                               emitted_at=end + 3 * MIN)
            for tier in TIERS[1:]:                # what each tier misses, as its job says it
                for o in sorted(o for o, _t in shorts):
                    yield Ranges.of(tier=tier, origin=self.name(o),
                                    origin_incarnation=f"{self.name(o)}-i1",
                                    emitter=f"{tier}/count", seq=w + 1,
                                    through=numbered[o] - 1, missing=lost[o],
                                    incarnation=f"{tier}-c1", emitted_at=end + 3 * MIN)

    @staticmethod
    def name(origin: int) -> str:
        return f"host-{origin:05d}"

    def _count(self, tier: str, origin: int, topic: int, start: int, count: int,
               distinct: int, at: int) -> AuditRecord:
        name = self.name(origin)
        producer = tier == "producer"
        return AuditRecord(
            tier=tier, origin=name, topic=f"fleet.t{topic:04d}", window_start=start,
            window_ms=WINDOW_MS, count=count, bytes=distinct * 100,
            # of the distinct records a tier holds: the same at every tier that holds them all
            checksum=(topic * 1_000_003 + start // WINDOW_MS * 10_007 + origin * 101) << 20,
            emitter=f"{name}/agent" if producer else f"{tier}/count", seq=1,
            emitted_at=at, distinct=distinct, duplicates=count - distinct,
            incarnation=f"{name}-i1" if producer else f"{tier}-c1")

    def expected(self, extra_windows: int = 0) -> dict:
        """What the reconciler must raise for the day and ``extra_windows`` after it: the
        data alerts by kind (loss at kafka-local, duplication at the aggregate), each one per
        (topic, window), and the whole-partition loss's origins."""
        loss, dup = set(), set()
        for o in range(self.origins):
            for w in range(self.windows + extra_windows):
                fault = self.fault(o, w)
                if fault:
                    t = self.topics_of(o)[fault[1]]
                    (loss if fault[0] == "loss" else dup).add((t, w))
        loss.add(self.whole_loss)
        return {"loss_alerts": len(loss), "duplication_alerts": len(dup),
                "whole_loss_origins": len(self.writers(self.whole_loss[0]))}
