"""Alert channel settings: every key declared once, with its type, default and help.

A channel is one table of the reconciler's configuration, ``[channels.NAME]``, whose ``type``
picks the settings below. :func:`parse` checks a table against them and returns the keyword
arguments of the channel's constructor; the reference in docs/alerts.md comes from
:func:`reference_markdown` (a test checks that the two agree). Unknown keys are errors. An error
names the key path (``channels.NAME.url``), what was expected, what was found, and a hint.
"""

from __future__ import annotations

import difflib
import re
from email.utils import parseaddr
from urllib.parse import urlsplit

from docket_common.settings import ConfigError, Setting, found

NAME = re.compile(r"^[A-Za-z0-9_-]+$")
RESERVED_HEADERS = ("content-type", "idempotency-key", "content-length")


class ChannelConfigError(ConfigError):
    """A channel table that cannot be used; ``path`` is the key at fault."""


_URL_HELP = "`http://` or `https://` address"

def _rate_limit(default: int) -> tuple[Setting, Setting]:
    """The two settings of a channel's rate limit (``alerts/outbox.py`` keeps it)."""
    return (Setting("max_per_period", int, default, "At most this many messages in any "
                    "`period_ms` (0: no limit). When more notifications are due than it lets "
                    "through, the rest go together as one digest message; with none left, "
                    "they wait until the period lets one more through.", minimum=0),
            Setting("period_ms", int, 600000, "The period of `max_per_period`.",
                    minimum=1000))


SETTINGS: dict[str, tuple[Setting, ...]] = {
    "webhook": (
        Setting("url", str, None, f"Where to POST, an {_URL_HELP}.", required=True,
                check="url"),
        Setting("format", str, "json", "`json`: the notification as JSON plus "
                "`idempotency_key`; `slack`: a Slack-compatible message (`text` and "
                "`attachments`), for Slack, Mattermost and Rocket.Chat incoming webhooks.",
                choices=("json", "slack")),
        Setting("timeout_ms", int, 5000, "Time allowed to connect, and then for each read of "
                "the answer.", minimum=1),
        Setting("headers", dict, {}, "Extra HTTP headers, e.g. `Authorization`. "
                "`Content-Type` and `Idempotency-Key` are docket's."),
        Setting("ca_file", str, None, "PEM file of the certificate authorities to trust for "
                "`https` (default: the system's)."),
        *_rate_limit(100),
    ),
    "email": (
        Setting("host", str, None, "SMTP server.", required=True),
        Setting("port", int, None, "SMTP port: 25 (relay), 587 (submission, with `starttls`).",
                required=True, minimum=1, maximum=65535),
        Setting("sender", str, None, "The `From` address.", required=True, check="address"),
        Setting("recipients", list, None, "The `To` addresses.", required=True,
                check="address"),
        Setting("starttls", bool, False, "Upgrade the connection with STARTTLS before "
                "anything else (and refuse to go on without it)."),
        Setting("username", str, None, "Log in with AUTH as this user (with `password`)."),
        Setting("password", str, None, "Password for `username`."),
        Setting("timeout_ms", int, 10000, "Time allowed to connect, and then for each "
                "exchange with the server.", minimum=1),
        Setting("ca_file", str, None, "PEM file of the certificate authorities to trust for "
                "STARTTLS (default: the system's)."),
        *_rate_limit(100),
    ),
    "alertmanager": (
        Setting("url", str, None, f"Base {_URL_HELP} of a Prometheus Alertmanager; docket "
                "posts to `{url}/api/v2/alerts`.", required=True, check="url"),
        Setting("timeout_ms", int, 5000, "Time allowed to connect, and then for each read of "
                "the answer.", minimum=1),
        Setting("firing_hold_ms", int, 7 * 24 * 3600 * 1000, "A firing alert is sent with "
                "`endsAt` this far after the send, so Alertmanager keeps it active until docket "
                "resolves it (docket does not re-send firing alerts).", minimum=60000),
        Setting("generator_url", str, None, "Sent as `generatorURL` (a link back, e.g. the "
                "docket dashboard).", check="url"),
        Setting("ca_file", str, None, "PEM file of the certificate authorities to trust for "
                "`https` (default: the system's)."),
        *_rate_limit(0),
    ),
}

_TYPE_NAMES = {int: "an integer", str: "a string", bool: "true or false",
               list: "a list of strings", dict: "a table of strings"}


def _check_type(s: Setting, path: str, value) -> None:
    ok = isinstance(value, s.type) and not (s.type is int and isinstance(value, bool))
    if ok and s.type is list:
        ok = all(isinstance(v, str) for v in value)
    if ok and s.type is dict:
        ok = all(isinstance(v, str) for v in value.values())
    if ok:
        return
    hint = s.help
    if s.type is int and isinstance(value, str | float):
        hint = f"write a whole number without quotes or units, e.g. {s.default or 5000}"
    elif s.type is list and isinstance(value, str):
        hint = f'write a list, e.g. {s.key} = ["{value}"]'
    raise ChannelConfigError(path, f"expected {_TYPE_NAMES[s.type]}, found {found(value)}",
                             hint)


def _check_value(s: Setting, path: str, value) -> None:
    if s.choices and value not in s.choices:
        raise ChannelConfigError(path, f"expected one of {', '.join(map(repr, s.choices))}, "
                                 f"found {value!r}", s.help)
    if s.minimum is not None and value < s.minimum:
        raise ChannelConfigError(path, f"must be at least {s.minimum}, found {value!r}", s.help)
    if s.maximum is not None and value > s.maximum:
        raise ChannelConfigError(path, f"must be at most {s.maximum}, found {value!r}", s.help)
    if s.type is list and s.required and not value:
        raise ChannelConfigError(path, "expected at least one entry, found an empty list",
                                 s.help)
    if s.check == "url":
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ChannelConfigError(path, f"expected an {_URL_HELP.strip('`')}, found "
                                     f"{value!r}", 'e.g. "https://hooks.example.com/docket"')
    if s.check == "address":
        for one in value if isinstance(value, list) else [value]:
            if "@" not in parseaddr(one)[1]:
                raise ChannelConfigError(path, f"expected an e-mail address, found {one!r}",
                                         'e.g. "docket@example.com" or '
                                         '"Docket <docket@example.com>"')
    if s.type is dict:
        for header in value:
            if header.lower() in RESERVED_HEADERS:
                raise ChannelConfigError(f"{path}.{header}", "docket sets this header itself",
                                         "remove it")


def parse(name: str, table: dict) -> tuple[str, dict]:
    """Check ``table`` (the ``[channels.NAME]`` table) and return ``(type, keyword arguments
    of the channel's constructor)``, defaults filled in. Raises :class:`ChannelConfigError`."""
    base = f"channels.{name}"
    if not isinstance(name, str) or not NAME.match(name):
        raise ChannelConfigError(base, f"a channel name may hold letters, digits, '_' and '-'; "
                                 f"found {name!r}", "rename the table, e.g. [channels.ops]")
    if not isinstance(table, dict):
        raise ChannelConfigError(base, f"expected a table, found {found(table)}",
                                 f'write [{base}] with type = "webhook" and its url')
    kind = table.get("type")
    if kind is None:
        raise ChannelConfigError(f"{base}.type", "missing",
                                 f"add type = one of {', '.join(map(repr, SETTINGS))}")
    if kind not in SETTINGS:
        raise ChannelConfigError(f"{base}.type", f"expected one of "
                                 f"{', '.join(map(repr, SETTINGS))}, found {found(kind)}",
                                 "webhook: HTTP POST (JSON or Slack); email: SMTP; "
                                 "alertmanager: a Prometheus Alertmanager")
    settings = {s.key: s for s in SETTINGS[kind]}
    for key in table:
        if key != "type" and key not in settings:
            close = difflib.get_close_matches(str(key), list(settings), n=1)
            hint = (f"did you mean {close[0]!r}? " if close else "") + \
                f"a {kind} channel takes: {', '.join(settings)}"
            raise ChannelConfigError(f"{base}.{key}", f"unknown key for a {kind} channel", hint)
    values = {}
    for key, s in settings.items():
        path = f"{base}.{key}"
        if key not in table:
            if s.required:
                raise ChannelConfigError(path, "missing", f"add {key} = ...: {s.help}")
            values[key] = s.default
            continue
        _check_type(s, path, table[key])
        _check_value(s, path, table[key])
        values[key] = table[key]
    if kind == "email" and (values["username"] is None) != (values["password"] is None):
        have, lack = ("username", "password") if values["password"] is None \
            else ("password", "username")
        raise ChannelConfigError(f"{base}.{lack}", f"missing: {have} is set",
                                 "set both username and password, or neither")
    return kind, values


def reference_markdown() -> str:
    """The channel settings as Markdown tables, one per type (docs/alerts.md holds them)."""
    lines = []
    for kind, settings in SETTINGS.items():
        lines += [f"### `type = \"{kind}\"`", "", "| key | type | default | meaning |",
                  "|---|---|---|---|"]
        for s in settings:
            default = "(required)" if s.required else (
                "—" if s.default is None else f"`{_toml(s.default)}`")
            kind_name = {list: "list[str]", dict: "table"}.get(s.type, s.type.__name__)
            if s.choices:
                kind_name = " \\| ".join(f"`{c}`" for c in s.choices)
            lines.append(f"| `{s.key}` | {kind_name} | {default} | {s.help} |")
        lines.append("")
    return "\n".join(lines)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{}"
    return str(value)
