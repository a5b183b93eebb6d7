"""The audit window, one concept for every tier (DESIGN.md, "Audit record"): the agent counts
what it accepted per (topic, window), the Spark jobs what a cluster or the warehouse holds, and
the reconciler sets those counts side by side — which only means something when every tier cuts
time the same way.

- ``DEFAULT_WINDOW_MS``, ``MIN_WINDOW_MS`` and ``window_setting``: the setting, declared once.
  The agent's ``audit.window_ms`` and the reconciler's ``windows.window_ms`` are this
  declaration; the jobs' ``--window-ms`` takes its default, help and floor from it.
- ``window_start``: the window a time in ms since the epoch falls in, ``[floor(ts / w) * w,
  + w)`` UTC — of one integer or of a numpy array of them (the agent tallies a slot at once).
- ``window_start_sql``: the same floor in Spark SQL, for the jobs. Floor, not truncation:
  Spark's ``div`` truncates toward zero, which would put a time before 1970 in another window
  than the agent does; ``ms - pmod(ms, w)`` does not.

A tier that counts in windows of another length than the reconciler judges is refused there,
record by record (``audit.reconcile.service``: reason ``window_mismatch``), with an error that
names the tier and both lengths — not judged slowly against windows it does not share.
"""

from __future__ import annotations

from .settings import Setting

DEFAULT_WINDOW_MS = 600_000
MIN_WINDOW_MS = 1_000
WINDOW_HELP = ("Event-time window of the audit counts, in ms: the same at every tier (the "
               "agents' `audit.window_ms`, the jobs' `--window-ms`, the reconciler's "
               "`windows.window_ms`).")


def window_setting(key: str) -> Setting:
    """The window's declaration under ``key`` in a configuration file."""
    return Setting(key, int, DEFAULT_WINDOW_MS, WINDOW_HELP, minimum=MIN_WINDOW_MS)


def window_start(ts_ms, window_ms: int = DEFAULT_WINDOW_MS):
    """The start of the window ``ts_ms`` falls in (an int, or a numpy integer array)."""
    return ts_ms // window_ms * window_ms


def window_start_sql(ms: str, window_ms: int) -> str:
    """``window_start`` in Spark SQL over ``ms``, an expression of ms since the epoch."""
    return f"({ms}) - pmod({ms}, {int(window_ms)})"
