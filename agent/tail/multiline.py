"""Multiline events: which lines of a file source begin an event, and which continue one.

A source's ``multiline`` table names one rule:

- ``start = REGEX``: a line the pattern matches begins an event; any other line continues the
  event before it;
- ``continue = REGEX``: a line the pattern matches continues the event before it; any other
  line begins one;
- ``preset = NAME``: a ``continue`` rule written here for a common case (``PRESETS``).

The first line read from a position the agent resumes at always begins an event: a checkpoint
only ever stands at an event's boundary (``reader.py``), so the line there began one.

Patterns run on RE2 (``google-re2``): its matching time is linear in the text, so no pattern,
however written, can make the agent hang on a line (Python's ``re`` backtracks: ``(a+)+$`` on
forty ``a`` and a ``b`` takes minutes). RE2 refuses what it cannot do in linear time
(backreferences, lookaround): ``validate`` says so with the key path and exits 78.

A pattern is matched against each line alone, without its newline (``^`` and ``$`` are the
line's start and end). Where the native extension is installed and the pattern means the same
to its engine (``rust_pattern``: the ``regex`` crate's, linear in the text too), every line of
a read that is UTF-8 throughout is matched in one call (``docket_native.LineMatcher``; RE2 takes
a surrogate's or an overlong byte sequence for a character, the crate does not). Otherwise the
pattern is searched for over a whole read, one RE2 call per match (the matches' positions
mapped to their lines with numpy), and every match is checked to stay within its line: a match
that runs past its line's end (``\\s`` matches a newline) is tried again on that line alone and
the search goes on from the next line, so the result is what a match per line would give.
"""

from __future__ import annotations

import re

import numpy as np

from ..patterns import MultilineRule, compile_search

# RE2's Perl classes are ASCII (``\\s`` without the vertical tab); the regex crate's are Unicode
# (and its ``\\s`` has the vertical tab): spelled out for it.
_PERL = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\f\\r "}
_FLAGS = set("imsU")                 # flags that mean the same to both engines, line by line
_PLAIN_ESCAPES = set("tnrfvax.^$|?*+()[]{}\\-/ #&~:,=!'\"@%;`_")
_COUNT = re.compile(r"\{\d+(?:,\d*)?\}")     # a counted repetition as RE2 reads one


def rust_pattern(pattern: str) -> str | None:
    """``pattern`` (RE2's syntax, matched against one line) as the regex crate reads it to
    the same effect, or None where the two might differ and RE2 is to run it: Unicode classes
    (``\\p``: the engines' Unicode tables differ by version), ``\\A``, ``\\z``, ``\\C``,
    ``\\Q…\\E``, octal or backreference digits, a negated Perl class inside brackets,
    brackets that the regex crate reads as nested classes or set operations, a range to or
    from a Perl class or from a ``]`` that opens a class, a ``{`` that RE2 reads as a
    character (``{,3}``, ``{2, 3}``), flags other than ``i``, ``m``, ``s`` and ``U`` (or
    turned off), and ``i`` with a character beyond ASCII (the case tables differ by Unicode
    version). ``\\<`` and ``\\>`` are RE2's characters, the crate's word edges: written
    plain."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_start = -1                 # where the class's first member is (a ``]`` there is one)
    folds = False                    # a flag group turns case folding on
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return None
            e = pattern[i + 1]
            if e in "dws":
                if in_class and (pattern.startswith("-", i + 2) and
                                 not pattern.startswith("-]", i + 2) or
                                 out and out[-1] == "-" and i - 1 != class_start):
                    return None               # a range to or from a class: read two ways
                out.append(_PERL[e] if in_class else f"[{_PERL[e]}]")
            elif e in "DWS":
                if in_class:
                    return None
                out.append(f"[^{_PERL[e.lower()]}]")
            elif e in "bB" and not in_class:
                out.append(f"(?-u:\\{e})")
            elif e == "x" and pattern.startswith("{", i + 2):
                end = pattern.find("}", i + 3)
                if end < 0:
                    return None
                out.append(pattern[i:end + 1])  # \x{263a}: the code point, in both
                i = end + 1
                continue
            elif e in "<>":
                out.append(e)                 # RE2: the character; the crate: a word's edge
            elif e in _PLAIN_ESCAPES:
                out.append(c + e)
            else:
                return None
            i += 2
            continue
        if in_class:
            if c == "]" and i == class_start and pattern.startswith("-", i + 1) \
                    and not pattern.startswith("-]", i + 1):
                return None                   # RE2: a range from ]; the crate: literals
            if c == "]" and i != class_start:
                in_class = False
            elif c == "[":
                if not pattern.startswith("[:", i):
                    return None
                end = pattern.find(":]", i + 2)
                if end < 0:
                    return None
                out.append(pattern[i:end + 2])
                i = end + 2
                continue
            elif pattern.startswith(("&&", "--", "~~"), i):
                return None
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class = True
            class_start = i + 2 if pattern.startswith("[^", i) else i + 1
            out.append(pattern[i:class_start])
            i = class_start
            continue
        if c == "{" and not _COUNT.match(pattern, i):
            return None            # RE2: a literal ({,3} {2, 3} {x}); the crate: a repetition
        if c == "(" and pattern.startswith("(?", i):
            rest = pattern[i + 2:]
            if not rest.startswith((":", "P<", "<")) or rest.startswith(("<=", "<!")):
                flags = rest[:len(rest) - len(rest.lstrip("imsU"))]
                after = rest[len(flags):len(flags) + 1]
                if not flags or after not in (")", ":") or not set(flags) <= _FLAGS:
                    return None
                folds = folds or "i" in flags
        out.append(c)
        i += 1
    if in_class:
        return None
    text = "".join(out)
    if folds and (not text.isascii() or "\\x" in text):
        return None                # case folding beyond ASCII: Unicode tables differ by version
    return text


def native_matcher(pattern: str):
    """``docket_native.LineMatcher`` for ``pattern`` where the native extension is installed
    and the pattern means the same to it (``rust_pattern``); else None (RE2 matches)."""
    translated = rust_pattern(pattern)
    if translated is None:
        return None
    try:
        from docket_native import LineMatcher
    except ImportError:
        return None
    try:
        return LineMatcher(translated)
    except ValueError:
        return None


class EventCutter:
    """Finds where events begin among a read's lines, for one source's rule."""

    def __init__(self, rule: MultilineRule, native: bool = True):
        self.rule = rule
        self._match = compile_search(rule.pattern)
        self.native = native_matcher(rule.pattern) if native else None

    def matching(self, data: bytes, line_starts: np.ndarray, line_ends: np.ndarray) -> np.ndarray:
        """Per line (``data[line_starts[i]:line_ends[i]]``, ends exclusive of the newline):
        whether the pattern matches it alone."""
        if self.native is not None and len(line_starts):
            hits = np.zeros(len(line_starts), np.uint8)
            if self.native.matching(data, np.ascontiguousarray(line_starts, np.int64),
                                    np.ascontiguousarray(line_ends, np.int64), hits):
                return hits.view(bool)
            # Not UTF-8 throughout: RE2 takes some byte sequences the crate does not (a
            # surrogate's, an overlong one) for characters, so RE2 decides this read.
        hits = np.zeros(len(line_starts), bool)
        if not len(line_starts):
            return hits
        search = self._match
        stop = int(line_ends[-1])
        pos = int(line_starts[0])
        while pos <= stop:
            spans = []
            while pos <= stop:                    # every match from pos on, one call each
                a, e = search(data, pos, stop)
                if a < 0:
                    break
                spans.append((a, e))
                pos = e if e > a else a + 1
            if not spans:
                break
            found = np.array(spans, np.int64)
            line = np.searchsorted(line_starts, found[:, 0], "right") - 1
            crossed = np.flatnonzero(found[:, 1] > line_ends[line])
            if not len(crossed):
                hits[line] = True
                break
            # A match ran past its line's end: the matches before it stand, that line alone
            # decides for itself, and the search goes on from the next line.
            k = int(crossed[0])
            hits[line[:k]] = True
            i = int(line[k])
            if search(data, int(line_starts[i]), int(line_ends[i]))[0] >= 0:
                hits[i] = True
            if i + 1 >= len(line_starts):
                break
            pos = int(line_starts[i + 1])
        return hits

    def begins(self, data: bytes, line_starts: np.ndarray, line_ends: np.ndarray) -> np.ndarray:
        """Per line: whether it begins an event. The first line always does."""
        hits = self.matching(data, line_starts, line_ends)
        out = hits if self.rule.begins else ~hits
        if len(out):
            out[0] = True
        return out


def line_bounds(data: bytes, n: int):
    """Starts and ends (newline excluded) of the whole lines of ``data[:n]``."""
    buf = np.frombuffer(data, np.uint8, n)
    newlines = np.flatnonzero(buf == 10)
    starts = np.empty(len(newlines), np.int64)
    starts[:1] = 0
    starts[1:] = newlines[:-1] + 1
    return starts, newlines.astype(np.int64)
