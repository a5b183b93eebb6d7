"""The audit package's named failures, under docket's base (``docket_common.errors``, where
the whole tree is drawn)."""

from __future__ import annotations

from docket_common.errors import DocketError


class AuditError(DocketError):
    """Base class of the audit package's failures."""


class MalformedRecord(AuditError):
    """A record on the audit topic that does not follow the contract: skipped and counted."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class BrokerUnreachable(AuditError):
    """No broker of a Kafka cluster answered in time."""
