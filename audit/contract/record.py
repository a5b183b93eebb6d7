"""The audit record: the contract between every tier (DESIGN.md, "Audit record").

Light on purpose: the agent imports this module, so it needs nothing beyond the standard
library and ``xxhash``; never PySpark.

Key ``{tier}|{origin}|{topic}|{window_start}``; value one JSON object::

    {"v": 1, "tier": "producer", "origin": "web-42", "topic": "app.events",
     "window_start": 1763766000000, "window_ms": 600000, "count": 12345, "bytes": 1234500,
     "checksum": "9f3a51c0d2e4b117", "dropped": 0, "dropped_reasons": {}, "late": 0,
     "emitter": "web-42/agent", "seq": 17, "emitted_at": 1763766612345}

``checksum`` is the sum mod 2^64 of XXH64(value, seed 42) over every value counted, as 16 hex
digits. Spark's ``xxhash64(col)`` is the same function (seed 42, as a signed long), so every tier
computes it natively; a test checks that the two agree byte for byte.

Record identity (DESIGN.md, "Record identity"): records carry ``docket-seq``, their origin's
record number, dense from 0 per (origin, origin incarnation). A count record may say how many
*distinct* (origin, incarnation, seq) it counted — ``distinct``, and ``duplicates`` = count −
distinct — or null when records without ``docket-seq`` were counted (never guessed); the
producer tier counts each record once (duplicates 0). Every emitter has an ``incarnation``
(created once with its state): the newest ``seq`` is kept per (tier, emitter, incarnation,
origin, topic, window), and an emitter's incarnations are summed, so an agent whose state was
lost (``seq`` from 1 again) is not hidden behind its former self. A tier that deduplicates
(``land --dedup``) says how many copies it read and did not keep in records of a third kind,
``skipped`` (key ``skipped|{tier}|{origin}|{topic}|{window_start}``, ``count`` and ``distinct``
0, the copies in ``skipped``), which readers add to the tier's count record; a reader that does
not know the kind skips it as malformed rather than take it for a count of 0.

A second kind, ``ranges`` (see :class:`Ranges`), key
``ranges|{tier}|{origin}|{origin_incarnation}``, says per origin number space which numbers a
tier has not seen below the highest it has (``through``): the missing ranges, capped at
``MAX_RANGES`` (smallest first) and totalled. The producer tier's ``through`` is the last
number sealed, its ``missing`` the numbers the loss journal holds, and its ``delivered`` the
highest number up to which every number is acknowledged by Kafka or journalled. Its count
records say ``sealed_through``: no record they count has a higher number.

A third kind, ``caught_up`` (see :class:`CaughtUp`), key
``caught_up|{tier}|{emitter}|{source}|{source_incarnation}``, is how a tier says, in positions
and never in clocks, how far it has read: its job has read every record its cluster held when
the audit record ``source_seq`` of the emitter ``source`` was there (and, for an agent's
reports, every record numbered up to ``source_delivered``). The reconciler's caught-up rule
(docs/reconcile.md, "Caught up") is built on it.

Besides counts, the audit jobs publish their progress on the same topic, under the key
``progress|{tier}|{emitter}`` with ``"kind": "progress"`` (see :class:`Progress`): the reconciler
reads how far behind the end of its input each job is. A reader that knows only counts skips
those as malformed, which the contract allows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import repeat
from typing import ClassVar

import xxhash

from .errors import MalformedRecord

VERSION = 1
HASH_SEED = 42
MASK64 = (1 << 64) - 1
MAX_RECORD_BYTES = 64 * 1024       # a bigger value is not an audit record: skipped as "huge"
MAX_NAME_CHARS = 512               # tier, origin, topic, emitter
MAX_RANGES = 1000                  # missing ranges listed in one ``ranges`` record
PRODUCER_TIER = "producer"
WAREHOUSE_TIER = "warehouse"
MIRROR_TIER = "mirror"          # a mirror watcher's caught_up records (audit.jobs.mirrored)


def value_hash(value: bytes | memoryview) -> int:
    """XXH64 of one record value with seed 42, unsigned: the term every tier sums."""
    return xxhash.xxh64_intdigest(value, HASH_SEED)


def value_hashes(values: Iterable[bytes | memoryview]) -> Iterator[int]:
    """``value_hash`` of each value, the loop in C (no Python call per value): for a slot."""
    return map(xxhash.xxh64_intdigest, values, repeat(HASH_SEED))


def checksum_hex(total: int) -> str:
    return f"{total & MASK64:016x}"


def combine_halves(lo_sum: int, hi_sum: int) -> int:
    """The checksum from the sums of each hash's low and high 32 bits (how Spark sums it
    without overflowing a long)."""
    return ((hi_sum << 32) + lo_sum) & MASK64


def newer(rec, other) -> bool:
    """Does ``rec`` replace ``other``, two records of one identity? The fields of the record's
    ``NEWEST_BY`` compared in order; a tie keeps ``other`` (the one held). The one rule for the
    reader of the topic (``collect``) and the reconciler's database (``store``, which writes it
    in SQL from the same fields, ``newer_sql``)."""
    fields = type(rec).NEWEST_BY
    return tuple(getattr(rec, f) for f in fields) > tuple(getattr(other, f) for f in fields)


def newer_sql(kind: type, table: str) -> str:
    """``newer`` as an upsert's condition: ``excluded`` (the new row) against ``table``."""
    fields = kind.NEWEST_BY
    terms = [" AND ".join([f"excluded.{g} = {table}.{g}" for g in fields[:i]]
                          + [f"excluded.{f} > {table}.{f}"])
             for i, f in enumerate(fields)]
    return " OR ".join(f"({t})" for t in terms)


@dataclass
class AuditRecord:
    tier: str
    origin: str
    topic: str
    window_start: int
    window_ms: int
    count: int
    bytes: int
    checksum: int                      # the sum mod 2^64; hex only on the wire
    emitter: str
    seq: int
    emitted_at: int = field(default_factory=lambda: int(time.time() * 1000))
    dropped: int = 0
    dropped_reasons: dict[str, int] = field(default_factory=dict)
    late: int = 0
    # Losses of unknown size (loss-journal entries: a file deleted or truncated before it was
    # read), by reason: the window may be short of what was written although counts agree.
    dropped_unknown: dict[str, int] = field(default_factory=dict)
    distinct: int | None = None        # distinct (origin, incarnation, seq); None: unknown
    duplicates: int | None = None      # count - distinct; None: unknown
    incarnation: str | None = None     # the emitter's; None from emitters before incarnations
    # Copies a deduplicating tier read and did not keep (``land --dedup``): not in ``count``.
    # None: the tier does not deduplicate.
    skipped: int | None = None
    # The producer's: the origin's last record number sealed when the counts were taken; every
    # record counted has a number up to it. None: records without numbers, or another tier.
    sealed_through: int | None = None
    # Not on the wire: when the reader got the record (the broker's append time, or the
    # reader's own clock when the topic's records carry their senders' time).
    arrived_at: int | None = field(default=None, compare=False)

    @property
    def is_skip_tally(self) -> bool:
        """Does it only say how many copies a deduplicating tier skipped (kind ``skipped``,
        ``land --dedup``'s ``warehouse/land-dedup`` records)? Such a record never competes
        with the tier's counts: readers add its ``skipped`` to them."""
        return self.count == 0 and self.skipped is not None

    @property
    def key(self) -> str:
        key = f"{self.tier}|{self.origin}|{self.topic}|{self.window_start}"
        return f"skipped|{key}" if self.is_skip_tally else key

    # Of two records of one identity the higher ``seq`` wins, then the later ``emitted_at``.
    NEWEST_BY: ClassVar[tuple[str, ...]] = ("seq", "emitted_at")

    @property
    def identity(self) -> tuple:
        """What the reconciler keeps one record per: the newest (``newer``) of it wins."""
        return (self.tier, self.emitter, self.incarnation or "", self.origin, self.topic,
                self.window_start)

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["arrived_at"]
        d["checksum"] = checksum_hex(self.checksum)
        if d["sealed_through"] is None:   # only a producer with record numbers says it
            del d["sealed_through"]
        if d["skipped"] is None:        # only a deduplicating tier says it
            del d["skipped"]
        elif self.is_skip_tally:        # a kind of its own: a reader that does not know it
            return {"v": VERSION, "kind": "skipped", **d}     # skips it, never counts it
        return {"v": VERSION, **d}

    def encode(self) -> tuple[bytes, bytes]:
        """(key, value) as they go to Kafka."""
        return self.key.encode(), json.dumps(self.to_dict(), separators=(",", ":")).encode()


def combined(records: list[AuditRecord]) -> AuditRecord:
    """One record for the sum of several (an emitter's incarnations, or several emitters of a
    tier): counts add; ``distinct`` is known only when known for all."""
    first = records[0]
    if len(records) == 1:
        return first
    out = AuditRecord(tier=first.tier, origin=first.origin, topic=first.topic,
                      window_start=first.window_start, window_ms=first.window_ms,
                      count=sum(r.count for r in records), bytes=sum(r.bytes for r in records),
                      checksum=sum(r.checksum for r in records) & MASK64,
                      emitter=",".join(sorted({r.emitter for r in records})),
                      seq=max(r.seq for r in records),
                      emitted_at=max(r.emitted_at for r in records),
                      dropped=sum(r.dropped for r in records), late=sum(r.late for r in records),
                      arrived_at=max((r.arrived_at for r in records if r.arrived_at is not None),
                                     default=None))
    for r in records:
        for name in ("dropped_reasons", "dropped_unknown"):
            into = getattr(out, name)
            for reason, n in getattr(r, name).items():
                into[reason] = into.get(reason, 0) + n
    if all(r.distinct is not None for r in records):
        out.distinct = sum(r.distinct for r in records)
        out.duplicates = out.count - out.distinct
    if any(r.skipped is not None for r in records):
        out.skipped = sum(r.skipped or 0 for r in records)
    return out


@dataclass
class Ranges:
    """Which of an origin's record numbers a tier has not seen (kind ``ranges``)."""

    tier: str
    origin: str
    origin_incarnation: str            # the number space: the origin's incarnation
    emitter: str
    seq: int
    through: int                       # the highest number seen (producer: given); -1: none
    missing: list[list[int]]           # inclusive [first, last] up to ``through``, sorted
    #                                    (only the producer's can end at ``through``: a number
    #                                    given to an event it dropped)
    missing_total: int                 # numbers missing in all (listed or not)
    missing_truncated: bool = False    # more ranges than listed
    incarnation: str | None = None     # the emitter's
    emitted_at: int = field(default_factory=lambda: int(time.time() * 1000))
    # The producer's: every number up to this one is acknowledged by Kafka or journalled
    # (numbers above it may still be in the agent's pool). None: not said.
    delivered: int | None = None

    @property
    def key(self) -> str:
        return f"ranges|{self.tier}|{self.origin}|{self.origin_incarnation}"

    NEWEST_BY: ClassVar[tuple[str, ...]] = ("seq", "emitted_at")

    @property
    def identity(self) -> tuple:
        return (self.tier, self.emitter, self.incarnation or "", self.origin,
                self.origin_incarnation)

    @classmethod
    def of(cls, *, missing: list[list[int]], **fields) -> Ranges:
        """A record listing at most ``MAX_RANGES`` of ``missing`` (sorted, merged)."""
        total = sum(b - a + 1 for a, b in missing)
        return cls(missing=[list(r) for r in missing[:MAX_RANGES]], missing_total=total,
                   missing_truncated=len(missing) > MAX_RANGES, **fields)

    def encode(self) -> tuple[bytes, bytes]:
        body = {"v": VERSION, "kind": "ranges", **asdict(self)}
        if self.delivered is None:
            del body["delivered"]
        return self.key.encode(), json.dumps(body, separators=(",", ":")).encode()


@dataclass
class Progress:
    """How far an audit job is: published every trigger beside its counts."""

    tier: str
    emitter: str
    batch_id: int
    input_rows_per_s: float
    processed_rows_per_s: float
    batch_duration_ms: int
    offsets_behind: int | None          # records between the job and the end of its input
    emitted_at: int = field(default_factory=lambda: int(time.time() * 1000))
    # The job publishes ``caught_up`` records: its tier is judged by them alone, and is not
    # caught up with anything before its first (False: a job that does not, judged by its
    # progress records' arrival).
    publishes_caught_up: bool = False
    incarnation: str | None = None      # the job's (its checkpoint's); None: not said
    # Not on the wire: when the reader got the record (see AuditRecord.arrived_at).
    arrived_at: int | None = field(default=None, compare=False)
    # One per (tier, emitter): the later ``emitted_at`` wins (the emitter's own clock: a job
    # started again on a new checkpoint counts its batches from 0), then the higher batch.
    NEWEST_BY: ClassVar[tuple[str, ...]] = ("emitted_at", "batch_id")

    @property
    def key(self) -> str:
        return f"progress|{self.tier}|{self.emitter}"

    def to_dict(self) -> dict:
        body = {"v": VERSION, "kind": "progress", **asdict(self)}
        del body["arrived_at"]
        return body

    def encode(self) -> tuple[bytes, bytes]:
        return self.key.encode(), json.dumps(self.to_dict(), separators=(",", ":")).encode()


@dataclass
class CaughtUp:
    """A tier's job has read everything its cluster held when the audit record ``source_seq``
    of ``source`` (an emitter, in its incarnation ``source_incarnation``) was there: the job
    read that record in a batch that also read every data partition to the offsets Kafka gave
    at the batch's start. ``source_delivered``: the highest ``delivered`` of ``source``'s
    ``ranges`` records read so far (an agent's: every record it numbered up to it was in Kafka
    before that record, so the tier has read it, or it is lost). Published when it grows."""

    tier: str
    emitter: str
    incarnation: str                   # the job's
    seq: int                           # the job's batch that proved it
    source: str
    source_incarnation: str
    source_seq: int
    source_delivered: int | None = None
    emitted_at: int = field(default_factory=lambda: int(time.time() * 1000))
    # Not on the wire: when the reader got the record (see AuditRecord.arrived_at).
    arrived_at: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return f"caught_up|{self.tier}|{self.emitter}|{self.source}|{self.source_incarnation}"

    def encode(self) -> tuple[bytes, bytes]:
        body = {"v": VERSION, "kind": "caught_up", **asdict(self)}
        del body["arrived_at"]
        return self.key.encode(), json.dumps(body, separators=(",", ":")).encode()


# -- parsing ------------------------------------------------------------------------------------
_COUNT_FIELDS = {
    "tier": str, "origin": str, "topic": str, "window_start": int, "window_ms": int,
    "count": int, "bytes": int, "checksum": str, "emitter": str, "seq": int, "emitted_at": int,
}
_OPTIONAL = {"dropped": int, "dropped_reasons": dict, "late": int,
             "dropped_unknown": dict, "distinct": int, "duplicates": int, "incarnation": str,
             "skipped": int, "sealed_through": int}
_RANGES_FIELDS = {"tier": str, "origin": str, "origin_incarnation": str, "emitter": str,
                  "seq": int, "emitted_at": int, "through": int, "missing": list,
                  "missing_total": int, "missing_truncated": bool}
_PROGRESS_FIELDS = {"tier": str, "emitter": str, "batch_id": int, "input_rows_per_s": float,
                    "processed_rows_per_s": float, "batch_duration_ms": int}
_CAUGHT_UP_FIELDS = {"tier": str, "emitter": str, "incarnation": str, "seq": int,
                     "source": str, "source_incarnation": str, "source_seq": int,
                     "emitted_at": int}

Record = AuditRecord | Ranges | Progress | CaughtUp


def parse(value: bytes | None) -> Record:
    """Validate one audit-topic value. Raises :class:`MalformedRecord` with a reason
    (``huge``, ``not_json``, ``not_object``, ``version``, ``missing_field``, ``wrong_type``,
    ``bad_value``) that readers count by."""
    if value is None:
        raise MalformedRecord("not_json", "the record has no value")
    if len(value) > MAX_RECORD_BYTES:
        raise MalformedRecord("huge", f"{len(value)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        obj = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedRecord("not_json", str(exc)[:200]) from None
    if not isinstance(obj, dict):
        raise MalformedRecord("not_object", f"a JSON {type(obj).__name__}, not an object")
    if obj.get("v") != VERSION:
        raise MalformedRecord("version", f"v = {obj.get('v')!r}; this reader knows {VERSION}")
    try:
        return _parse_object(obj)
    except (TypeError, ValueError, AttributeError) as exc:   # what the checks did not foresee
        raise MalformedRecord("bad_value", f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _parse_object(obj: dict) -> Record:
    if obj.get("kind", "count") == "progress":
        _check(obj, _PROGRESS_FIELDS, {"offsets_behind": int, "emitted_at": int,
                                       "publishes_caught_up": bool, "incarnation": str})
        return Progress(**{k: obj[k] for k in (*_PROGRESS_FIELDS, "emitted_at",
                                               "publishes_caught_up", "incarnation")
                           if obj.get(k) is not None},
                        offsets_behind=obj.get("offsets_behind"))
    if obj.get("kind", "count") == "ranges":
        return _parse_ranges(obj)
    if obj.get("kind", "count") == "caught_up":
        return _parse_caught_up(obj)
    kind = obj.get("kind", "count")
    if kind not in ("count", "skipped"):
        raise MalformedRecord("bad_value", f"kind {str(kind)[:40]!r} is unknown")
    _check(obj, _COUNT_FIELDS, _OPTIONAL)
    if (kind == "skipped") != (obj.get("skipped") is not None) or \
            (kind == "skipped" and (obj["count"] != 0 or obj.get("distinct") != 0)):
        raise MalformedRecord("bad_value", "skipped is said only by a kind skipped record, "
                              "whose count and distinct are 0")
    for name in ("tier", "origin", "topic", "emitter"):
        if not obj[name] or len(obj[name]) > MAX_NAME_CHARS:
            raise MalformedRecord("bad_value", f"{name} must have 1 to {MAX_NAME_CHARS} chars")
    for name in ("count", "bytes", "seq", "dropped", "late", "window_start", "distinct",
                 "duplicates", "skipped"):
        if (obj.get(name) or 0) < 0:
            raise MalformedRecord("bad_value", f"{name} = {obj[name]} is negative")
    if (obj.get("sealed_through") or 0) < -1:
        raise MalformedRecord("bad_value", f"sealed_through = {obj['sealed_through']}")
    distinct, duplicates = obj.get("distinct"), obj.get("duplicates")
    if distinct is not None and distinct > obj["count"]:
        raise MalformedRecord("bad_value", f"distinct {distinct} exceeds count {obj['count']}")
    if (distinct is None) != (duplicates is None) or \
            (distinct is not None and distinct + duplicates != obj["count"]):
        raise MalformedRecord("bad_value", f"duplicates {duplicates} is not count "
                              f"{obj['count']} - distinct {distinct}")
    if obj["window_ms"] <= 0 or obj["window_start"] % obj["window_ms"]:
        raise MalformedRecord("bad_value", f"window_start {obj['window_start']} is not a "
                              f"multiple of window_ms {obj['window_ms']}")
    checksum = obj["checksum"]
    if len(checksum) != 16 or any(c not in "0123456789abcdef" for c in checksum):
        raise MalformedRecord("bad_value", f"checksum {checksum[:40]!r} is not 16 hex digits")
    for name in ("dropped_reasons", "dropped_unknown"):
        reasons = obj.get(name) or {}
        if not all(isinstance(k, str) and _is_int(v) and v >= 0 for k, v in reasons.items()):
            raise MalformedRecord("wrong_type", f"{name} must map reasons to counts")
    fields = {k: obj[k] for k in (*_COUNT_FIELDS, *_OPTIONAL) if obj.get(k) is not None}
    fields["checksum"] = int(checksum, 16)
    return AuditRecord(**fields)


def _parse_caught_up(obj: dict) -> CaughtUp:
    _check(obj, _CAUGHT_UP_FIELDS, {"source_delivered": int})
    for name in ("tier", "emitter", "incarnation", "source", "source_incarnation"):
        if not obj[name] or len(obj[name]) > MAX_NAME_CHARS:
            raise MalformedRecord("bad_value", f"{name} must have 1 to {MAX_NAME_CHARS} chars")
    if obj["seq"] < 0 or obj["source_seq"] < 0 or (obj.get("source_delivered") or 0) < -1:
        raise MalformedRecord("bad_value", f"seq {obj['seq']}, source_seq {obj['source_seq']}"
                              f", source_delivered {obj.get('source_delivered')}")
    return CaughtUp(**{k: obj[k] for k in (*_CAUGHT_UP_FIELDS, "source_delivered")
                       if obj.get(k) is not None})


def _parse_ranges(obj: dict) -> Ranges:
    _check(obj, _RANGES_FIELDS, {"incarnation": str, "delivered": int})
    for name in ("tier", "origin", "origin_incarnation", "emitter"):
        if not obj[name] or len(obj[name]) > MAX_NAME_CHARS:
            raise MalformedRecord("bad_value", f"{name} must have 1 to {MAX_NAME_CHARS} chars")
    through, missing = obj["through"], obj["missing"]
    if through < -1 or obj["seq"] < 0:
        raise MalformedRecord("bad_value", f"through = {through} (seq {obj['seq']})")
    delivered = obj.get("delivered")
    if delivered is not None and not -1 <= delivered <= through:
        raise MalformedRecord("bad_value", f"delivered = {delivered} is not between -1 and "
                              f"through {through}")
    if len(missing) > MAX_RANGES:
        raise MalformedRecord("bad_value", f"{len(missing)} missing ranges, more than "
                              f"{MAX_RANGES}")
    last = -1
    for r in missing:
        if not (isinstance(r, list) and len(r) == 2 and all(map(_is_int, r))
                and last < r[0] <= r[1] <= through):
            raise MalformedRecord("bad_value", f"missing range {str(r)[:60]} is not an "
                                  "ascending, disjoint [first, last] up to through")
        last = r[1]
    listed = sum(b - a + 1 for a, b in missing)
    if obj["missing_total"] < listed or (obj["missing_total"] > listed) != \
            obj["missing_truncated"]:
        raise MalformedRecord("bad_value", f"missing_total {obj['missing_total']} does not "
                              f"fit the {listed} numbers listed (truncated: "
                              f"{obj['missing_truncated']})")
    return Ranges(**{k: obj[k] for k in (*_RANGES_FIELDS, "incarnation", "delivered")
                     if obj.get(k) is not None})


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(obj: dict, required: dict, optional: dict) -> None:
    for name in required:
        if name not in obj:
            raise MalformedRecord("missing_field", f"no {name!r}")
    for name, kind in {**required, **optional}.items():
        if name not in obj or (name in optional and obj[name] is None):
            continue
        v = obj[name]
        ok = (_is_int(v) if kind is int else
              (isinstance(v, (int, float)) and not isinstance(v, bool)) if kind is float else
              isinstance(v, kind))
        if not ok:
            raise MalformedRecord("wrong_type", f"{name} is {type(v).__name__}, not "
                                  f"{kind.__name__}")
