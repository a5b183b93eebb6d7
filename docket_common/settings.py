"""Settings declared once: the machinery every docket configuration file shares.

A component declares each of its settings as a :class:`Setting` (dotted key, type, default,
help, and optional choices, minimum, required). :func:`parse_sections` validates a parsed TOML
document against the declarations and fills in defaults; :func:`reference_table` writes the
reference page's rows from the same declarations. Unknown sections and keys are errors. Every
error is a :class:`ConfigError` naming the key path, what was expected, what was found, and a
hint; the CLIs print it and exit 78 (``EX_CONFIG``).
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DocketError

EX_CONFIG = 78


class ConfigError(DocketError):
    """A setting that is wrong: its key path, the problem (what was expected, what was found)
    and a hint. Printed without a prefix (``render()``), exit code 78."""

    def __init__(self, path: str, problem: str, hint: str = ""):
        super().__init__(f"Error in configuration at '{path}': {problem}", hint)
        self.path, self.problem = path, problem


@dataclass(frozen=True)
class Setting:
    key: str                       # dotted path, e.g. "buffer.size_bytes"
    type: type                     # int, float, str, bool, list (of str), dict (free-form table)
    default: Any
    help: str
    choices: tuple = ()
    minimum: float | None = None
    required: bool = False
    maximum: float | None = None
    check: str = ""                # a further check of the value's form, named by its owner


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               list: "a list of strings", dict: "a table"}


def found(value) -> str:
    """How a wrong value is shown in an error: the value and its TOML kind."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "table"}.get(type(value), type(value).__name__)
    shown = repr(value) if not isinstance(value, dict | list) else kind
    return f"{shown} ({kind})"


def host_port(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (an IPv6 host in brackets; port 0 to 65535) → (host, port), None when
    ``text`` is not one. The listen addresses of the agent, the reconciler and the dashboard."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return None
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this host's own: ``localhost`` or a loopback
    address. The dashboard listens beyond it only with a token; a token endpoint beyond it only
    over https."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def coerce(s: Setting, path: str, value):
    """``value`` checked against ``s`` (an integer is taken for a float); raises ConfigError."""
    if s.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = isinstance(value, s.type) and not (s.type is int and isinstance(value, bool))
    if s.type is list and ok:
        ok = all(isinstance(v, str) for v in value)
    if not ok:
        hint = ""
        if s.type is int and isinstance(value, str):
            hint = "write the number without quotes or units, e.g. 1048576"
        if s.type is str and isinstance(value, list) and all(isinstance(v, str) for v in value):
            hint = f"write one comma-separated string: {json.dumps(','.join(value))}"
        raise ConfigError(path, f"expected {_TYPE_NAMES[s.type]}, found {found(value)}", hint)
    if s.choices and value not in s.choices:
        raise ConfigError(path, f"expected one of {', '.join(map(repr, s.choices))}, found "
                          f"{value!r}", hint=s.help)
    if s.minimum is not None and value < s.minimum:
        raise ConfigError(path, f"must be at least {s.minimum:g}, found {value!r}", hint=s.help)
    if s.maximum is not None and value > s.maximum:
        raise ConfigError(path, f"must be at most {s.maximum:g}, found {value!r}", hint=s.help)
    return value


def unknown_hint(name: str, known, what: str) -> str:
    """The hint for an unknown name: the closest known one first, then the whole list."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    listed = f"{what}: {', '.join(sorted(known))}"
    return f"did you mean {close[0]!r}? {listed}" if close else listed


def section_table(raw: dict, name: str) -> dict:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(name, f"expected a table [{name}], found {found(table)}")
    return table


def parse_sections(raw: dict, settings: tuple[Setting, ...],
                   other_sections: tuple[str, ...] = ()) -> dict[str, Any]:
    """The values of ``settings`` (dotted key → value) from ``raw``, defaults filled in.
    ``other_sections``: top-level names the caller parses itself (e.g. ``sources``)."""
    by_section: dict[str, dict[str, Setting]] = {}
    for s in settings:
        section, key = s.key.split(".", 1)
        by_section.setdefault(section, {})[key] = s
    for top in raw:
        if top not in by_section and top not in other_sections:
            raise ConfigError(top, "unknown section", hint=unknown_hint(
                top, [*by_section, *other_sections], "known sections"))
    values: dict[str, Any] = {}
    for section, known in by_section.items():
        table = section_table(raw, section)
        for key in table:
            if key not in known:
                raise ConfigError(f"{section}.{key}", "unknown key", hint=unknown_hint(
                    key, known, f"known keys in [{section}]"))
        for key, s in known.items():
            if key in table:
                values[s.key] = coerce(s, s.key, table[key])
            elif s.required:
                raise ConfigError(s.key, "missing", hint=s.help)
            else:
                values[s.key] = s.default
    return values


def parse_table(table: dict, settings: tuple[Setting, ...], where: str,
                what: str) -> dict[str, Any]:
    """One table of an array of tables (``[[sources]]``, ``[[owners]]``): its values by key,
    defaults filled in. ``where``: its path (``sources[0]``); ``what``: what one is called in
    a hint (``a source``)."""
    known = {s.key: s for s in settings}
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}.{key}", "unknown key",
                              hint=unknown_hint(key, known, f"known keys of {what}"))
    values = {}
    for key, s in known.items():
        if key in table:
            values[key] = coerce(s, f"{where}.{key}", table[key])
        elif s.required:
            raise ConfigError(f"{where}.{key}", "missing", hint=s.help)
        else:
            values[key] = s.default
    return values


def parse_tables(raw, name: str, settings: tuple[Setting, ...], what: str,
                 hint: str) -> list[dict[str, Any]]:
    """An array of tables (``[[name]]``), each parsed as ``parse_table`` does; anything else
    under ``name`` is a ConfigError with ``hint`` (how to write one)."""
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise ConfigError(name, f"expected an array of tables [[{name}]]", hint=hint)
    return [parse_table(table, settings, f"{name}[{i}]", what) for i, table in enumerate(raw)]


def load_toml(path: str | Path) -> dict:
    """A configuration file, parsed; unreadable or invalid TOML is a ConfigError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the file: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"not UTF-8 text (byte {exc.start}): a TOML file is "
                          "UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from exc


def reference_row(key: str, s: Setting) -> str:
    """One row of a reference table: key, type, default, meaning."""
    default = "(required)" if s.required else (
        "—" if s.default is None else f"`{json.dumps(s.default)}`")
    kind = s.type.__name__ if s.type is not list else "list[str]"
    if s.choices:
        kind = " \\| ".join(f"`{c}`" for c in s.choices)
    return f"| `{key}` | {kind} | {default} | {s.help} |"


def reference_table(settings: tuple[Setting, ...]) -> list[str]:
    """The reference of ``settings``, one table per section, as Markdown lines."""
    lines: list[str] = []
    section = None
    for s in settings:
        sec = s.key.split(".", 1)[0]
        if sec != section:
            section = sec
            lines += ["", f"## [{sec}]", "", "| key | type | default | meaning |",
                      "|---|---|---|---|"]
        lines.append(reference_row(s.key, s))
    return lines
