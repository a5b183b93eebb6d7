"""Multiline rules as a source configures them: the presets, the checks, RE2's compile.

The configuration checks a source's ``multiline`` table with ``MultilineRule.from_table`` (a
pattern RE2 refuses is a config error naming its key); ``agent/tail/multiline.py`` runs the
rule over what is read. Why RE2, and how a rule decides, is said there.
"""

from __future__ import annotations

from dataclasses import dataclass

try:
    import re2
except ImportError:                      # pragma: no cover - a dependency of the package
    re2 = None

# A preset is a ``continue`` pattern: lines that belong to the event before them.
PRESETS: dict[str, str] = {
    # Java (Logback, Log4j 2, java.util.logging): "\tat ...", "\t... 12 more", "Caused by: ...",
    # "\tSuppressed: ...", "... 5 common frames omitted", and the exception's own line
    # ("java.lang.IllegalStateException: ...", a dotted class name ending Exception/Error/...).
    "java": r"^(?:\s+at\s|\s+\.\.\.\s+\d+\s+(?:more|common frames omitted)|\s*Caused by:|"
            r"\s*Suppressed:|[\w$]+(?:\.[\w$]+)+(?:Exception|Error|Throwable)(?::|$))",
    # Python's traceback: its header, indented frame lines, the chained-exception sentences,
    # blank lines between chained tracebacks, and the exception line ("ValueError: ...").
    "python": r"^(?:Traceback \(most recent call last\):|\s|$|During handling of the above "
              r"exception|The above exception was the direct cause|"
              r"[A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit|Interrupt|Iteration)(?::|$))",
    # A Go panic: blank lines, "goroutine 1 [running]:", "main.main()" frames, tab-indented
    # file:line lines, "created by ...", "[signal ...", "exit status 2".
    "go": r"^(?:\s|$|goroutine \d+ \[|created by |\[signal |exit status \d+$|"
          r"[\w.*/()\[\]-]+\(.*\)$)",
    # Ruby: backtrace lines ("\tfrom /app/x.rb:7:in `<main>'", "/app/x.rb:3:in `foo'").
    "ruby": r"^(?:\s+from\s|\s|/\S+:\d+:in\s)",
}

DEFAULT_FLUSH_MS = 1000
DEFAULT_MAX_EVENT_BYTES = 1 << 20
KEYS = ("preset", "start", "continue", "flush_ms", "max_event_bytes")


class PatternError(ValueError):
    """A pattern RE2 refuses; ``key`` names the multiline key it came from."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class MultilineRule:
    pattern: str
    begins: bool            # True: a matching line begins an event (start); False: continues
    flush_ms: int = DEFAULT_FLUSH_MS
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES

    @classmethod
    def from_table(cls, table: dict) -> MultilineRule:
        """The rule a source's ``multiline`` table names; ValueError (PatternError for a
        pattern) naming what is wrong. Checked once by the config, so the agent never
        starts with a pattern it cannot run."""
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            raise PatternError(unknown[0], f"is not a multiline key (keys: {', '.join(KEYS)})")
        named = [k for k in ("preset", "start", "continue") if k in table]
        if len(named) != 1:
            raise PatternError("", "name exactly one of preset, start or continue, found "
                               + (", ".join(named) or "none"))
        key = named[0]
        value = table[key]
        if not isinstance(value, str) or not value:
            raise PatternError(key, f"expected a non-empty string, found {value!r}")
        if key == "preset":
            if value not in PRESETS:
                raise PatternError(key, f"no preset {value!r} (presets: "
                                   f"{', '.join(sorted(PRESETS))})")
            pattern, begins = PRESETS[value], False
        else:
            pattern, begins = value, key == "start"
        compile_pattern(pattern, key)
        flush = table.get("flush_ms", DEFAULT_FLUSH_MS)
        biggest = table.get("max_event_bytes", DEFAULT_MAX_EVENT_BYTES)
        for name, v, low in (("flush_ms", flush, 1), ("max_event_bytes", biggest, 1024)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise PatternError(name, f"expected an integer of at least {low}, found {v!r}")
        return cls(pattern, begins, flush, biggest)


def compile_pattern(pattern: str, key: str = "start"):
    """``pattern`` compiled by RE2 in multiline mode (``^``/``$`` at line ends)."""
    if re2 is None:
        raise PatternError(key, "multiline needs the google-re2 package (pip install "
                           "google-re2), which the agent's package depends on")
    options = re2.Options()
    options.log_errors = False
    options.never_capture = True      # only the whole match's span is asked for
    try:
        return re2.compile("(?m)" + pattern, options)     # ^ and $ at every line's ends
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        why = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise PatternError(key, f"RE2 cannot compile {pattern!r}: {why}") from None


def compile_search(pattern: str):
    """RE2's own search for ``pattern`` in bytes, without the wrapper's match object (a third
    of the time per call): ``search(text, pos, endpos)`` → the first match's (start, end), or
    (-1, -1)."""
    raw = compile_pattern(pattern)._regexp.Match
    unanchored = re2._re2.RE2.Anchor.UNANCHORED

    def search(text: bytes, pos: int, endpos: int) -> tuple[int, int]:
        return raw(unanchored, text, pos, endpos)[0]

    return search
