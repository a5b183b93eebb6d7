"""The agent's log output: text or JSON lines, and repeated lines held back.

During a broker outage librdkafka reports every failed connection (about 20 lines a second
against one broker) and the audit emitter every round not acknowledged. An operator needs the
change of state once and then a reminder, not 1.8 million lines a day: :class:`Quieter` lets the
first line of each kind through, then at most one per ``every_s``, saying how many like it were
held back (and :func:`flush_held` says it when no later line comes to carry the count). A "kind" is
the logger, the level, the message with its numbers blanked (the same failure against another
port or after another delay is the same kind) and the exception's type. DEBUG lines, asked for
with ``--log-level debug`` (and librdkafka's ``debug`` setting), are never held back.

Messages known to be expected noise (a fresh broker's ``Coordinator load in progress`` while
the idempotent producer starts) are logged at INFO, not WARNING.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time

from docket_common.formats import utc_iso

QUIET_EVERY_S = 60.0
EXPECTED_NOISE = ("Coordinator load in progress", "COORDINATOR_LOAD_IN_PROGRESS")
_NUMBERS = re.compile(r"\d+")
_MAX_KINDS = 1000


class Quieter(logging.Filter):
    def __init__(self, every_s: float = QUIET_EVERY_S, clock=time.monotonic):
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self._kinds: dict[tuple, list] = {}   # kind → [next line allowed at, held, a held line]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "docket_held_summary", False) or record.levelno < logging.INFO:
            return True             # DEBUG lines were asked for (--log-level, librdkafka's debug)
        message = record.getMessage()
        if record.levelno == logging.WARNING and any(n in message for n in EXPECTED_NOISE):
            record.levelno, record.levelname = logging.INFO, "INFO"
        error = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        kind = (record.name, record.levelno, _NUMBERS.sub("#", message), error)
        now = self.clock()
        with self._lock:
            state = self._kinds.get(kind)
            if state is not None and now < state[0]:
                state[1] += 1
                state[2] = message
                return False
            if len(self._kinds) >= _MAX_KINDS:
                self._kinds.clear()
            held = state[1] if state is not None else 0
            self._kinds[kind] = [now + self.every_s, 0, None]
        if held:
            record.msg = f"{message} ({held} more like it held back since the last one shown)"
            record.args = ()
        return True

    def held_due(self) -> list[tuple[str, int, str]]:
        """Kinds whose quiet time is over with lines still held back and none since to carry
        their count: (logger, level, a line saying how many, with the last of them)."""
        now = self.clock()
        out = []
        with self._lock:
            for (name, level, _shape, _error), state in self._kinds.items():
                if state[1] and now >= state[0]:
                    out.append((name, level, f"{state[1]} more like this held back: "
                                f"{state[2]}"))
                    state[1], state[2] = 0, None
        return out


_QUIETERS: list[Quieter] = []


def flush_held() -> None:
    """Log the counts of held-back lines whose quiet time is over (the agent's loop calls this
    every second), so a burst that ends is still counted."""
    for quieter in _QUIETERS:
        for name, level, text in quieter.held_due():
            logging.getLogger(name).log(level, "%s", text, extra={"docket_held_summary": True})


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (RFC 3339, UTC, milliseconds), level, logger, message,
    and the exception's text when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        ms = int(record.created) * 1000 + int(record.msecs)
        out = {"ts": utc_iso(ms, millis=True), "level": record.levelname,
               "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


# The loggers whose lines repeat in bursts: librdkafka's (both producers log through it) and
# the audit emitter's (a round not acknowledged, every round of an outage). docket's other
# lines, the loss journal's among them, each say something of their own and are never held.
QUIETED = ("docket.agent.librdkafka", "docket.agent.audit")


def setup(level: str, fmt: str = "text") -> None:
    """Logging for ``docket-agent run``: to stderr (the journal under systemd), as text or
    JSON lines, with the repeating loggers quieted."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in QUIETED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, Quieter) for f in logger.filters):
            quieter = Quieter()
            logger.addFilter(quieter)
            _QUIETERS.append(quieter)
