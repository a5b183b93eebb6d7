"""Docket's named failures: the base class every package's errors derive from, the one function
that prints them at the command line, and the audit package's errors.

The core raises named exceptions; only the edges (the CLIs) format them, through
:func:`print_error`: the message, then what to do about it on a line of its own. The base lives
in the contract because every docket host installs the contract (agent hosts install neither
``broker/``'s cluster tooling nor the Spark jobs).
"""

from __future__ import annotations

import sys


class DocketError(Exception):
    """A failure that says what is wrong (the message) and what to do about it (``hint``)."""

    hint: str = ""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint

    def render(self, prefix: str = "") -> str:
        """The message (after ``prefix: `` when given), and the hint on a line of its own."""
        text = f"{prefix}: {self}" if prefix else str(self)
        return text + (f"\n  hint: {self.hint}" if self.hint else "")


def print_error(exc: DocketError, prefix: str = "") -> None:
    """Print ``exc`` to stderr for the person at the command line: message, then hint."""
    print(exc.render(prefix), file=sys.stderr)


class AuditError(DocketError):
    """Base class of the audit package's failures."""


class MalformedRecord(AuditError):
    """A record on the audit topic that does not follow the contract: skipped and counted."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class BrokerUnreachable(AuditError):
    """No broker of a Kafka cluster answered in time."""
