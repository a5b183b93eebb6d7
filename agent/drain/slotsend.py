"""One sealed slot on its way to Kafka (``SlotSend``): the cursor over its records and what
became of each — acknowledged in bulk, to send again, to send alone, dead-lettered.
"""

from __future__ import annotations

import collections

from ..buffer import SealedSlot
from .headers import Record


class SendState:
    """What a send of a slot keeps whichever path sends it: its records to send again, to send
    alone, the one a full queue refused, and the dead-lettered ones. The drain's handlers work
    on it alone."""

    __slots__ = ()

    @property
    def unsent(self) -> bool:
        """Records of it not yet handed over: blocks past the cursor, or one a full queue
        refused."""
        return self.bi < len(self.blocks) or self.pending is not None

    @property
    def dead(self) -> int:
        return len(self.dead_records)

    @property
    def acked(self) -> int:
        return self.total - self.dead

    @property
    def to_send_again(self) -> int:
        """Records a send in its place would carry: every one not dead."""
        return self.total - self.dead

    def waiting(self) -> bool:
        """Records of it wait to go again, or to be reported after going alone."""
        return bool(self.retry or self.alone or self.alone_out)


class SlotSend(SendState):
    """One sealed slot on its way to Kafka: a cursor over its records (``blocks``, from
    ``Drain.block_lists``, and the payload they slice) and what became of them. It knows
    nothing of the drain: the drain's report handlers take the send as their first argument.

    ``previous``: the send of the same slot by a producer that a fatal error replaced. That
    one is retired (reports still coming for it are ignored) and this one sends the slot again
    from its first record, leaving out what is already dead-lettered."""

    __slots__ = ("slot", "total", "dead_records", "retry", "alone", "alone_out",
                 "pending", "payload", "blocks", "bi", "ri", "handed", "retired", "_originals",
                 "_left_out", "_covered")

    def __init__(self, slot: SealedSlot, payload: bytes | None = None,
                 blocks: list[tuple] | None = None, previous: SlotSend | None = None):
        self.slot = slot
        self.total = slot.record_count
        self.retry: list[Record] = []
        self.alone: list[Record] = []           # refused with their batch as too large
        self.alone_out = 0                      # sent alone, not yet reported
        self.pending: Record | None = None      # refused by a full local queue; next first
        self.bi = self.ri = 0                   # cursor: next block, next record in it
        self.handed = 0                         # the drain's hand-over number of the last record
        self.retired = False
        self._originals: dict | None = None     # (value, key) → [(timestamp, headers)]
        self._covered: collections.Counter = collections.Counter()   # reports to skip
        if previous is None:
            self.dead_records: list[Record] = []
            self.payload = payload
            self.blocks = blocks
        else:
            previous.retired = True
            self.dead_records = previous.dead_records
            self.payload = previous.payload
            self.blocks = previous._blocks_without(self.dead_records[previous._left_out:])
        self._left_out = len(self.dead_records)     # dead records ``blocks`` leaves out

    def finished(self, settled: int) -> bool:
        """Every record handed over before the last zero point (``settled``: the drain's
        hand-over number there), none waiting to go again."""
        return not self.unsent and not self.waiting() and self.handed <= settled

    def failed_records(self, msg) -> list[Record]:
        """The records a failed report (of a record from ``blocks``) is about: none when the
        report is covered by twins already sent again."""
        value, key = msg.value(), msg.key()
        if self._covered[(value, key)]:             # already sent again with its twins
            self._covered[(value, key)] -= 1
            return []
        return [(msg.topic(), value, key, ts, headers)
                for ts, headers in self._originals_of(value, key)]

    def _originals_of(self, value: bytes, key: bytes | None) -> list[tuple[int, list | None]]:
        """The records a failed report may be about: one, or — when the slot holds the same
        value and key more than once, under other numbers or times, not yet reported — all of
        them. A report in error carries no headers, so it cannot say which twin failed: every
        twin goes again (a twin that had arrived arrives twice, the same record twice), and
        the twins' own failed reports, if they come, are skipped. Never a twin's number
        swapped for another's."""
        first = self._original(value, key)
        twins = self._originals.get((value, key)) or []
        if not twins:
            return [first]
        self._originals[(value, key)] = []
        self._covered[(value, key)] += len(twins)
        return [first, *twins]

    def _original(self, value: bytes, key: bytes | None) -> tuple[int, list | None]:
        """A report in error carries neither the timestamp nor the headers (librdkafka gives
        none for a failed message; seen: timestamp type 0, -1): find them in the slot. A
        record fails here at most once (its resend reports through ``ack_record``), so each
        entry is taken once."""
        if self._originals is None:
            self._originals = {}
            payload = self.payload
            for offsets, lengths, times, keys, headers in self.blocks:
                for i, o in enumerate(offsets):
                    k = keys[i] if keys else None
                    self._originals.setdefault((payload[o:o + lengths[i]], k), []).append(
                        (times[i], headers.of(i)))
        found = self._originals.get((value, key))
        if not found:
            raise RuntimeError(f"a delivery report for a record that is not in slot "
                               f"{self.slot.seq}")
        return found.pop()

    def _blocks_without(self, records: list[Record]) -> list[tuple]:
        """The blocks less ``records`` (dead-lettered since this send began), for sending the
        slot again."""
        if not records:
            return self.blocks
        gone = collections.Counter((v, k, ts, tuple(h or ())) for _t, v, k, ts, h in records)
        out = []
        for offsets, lengths, times, keys, headers in self.blocks:
            keep = []
            for i, o in enumerate(offsets):
                ident = (self.payload[o:o + lengths[i]], keys[i] if keys else None, times[i],
                         tuple(headers.of(i) or ()))
                if gone[ident]:
                    gone[ident] -= 1
                else:
                    keep.append(i)
            out.append(([offsets[i] for i in keep], [lengths[i] for i in keep],
                        [times[i] for i in keep], [keys[i] for i in keep] if keys else keys,
                        headers.subset(keep)))
        return out
