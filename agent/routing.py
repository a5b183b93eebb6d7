"""Topic and key templates over an event's fields: ``"syslog.{app}"``, ``"{host}"``.

A template is text with ``{field}`` placeholders (a field name: letters, digits, ``_``). It
renders when every field it names is present and not null; a topic must then also be a name
Kafka takes (``[A-Za-z0-9._-]``, 1–249 characters), else the event goes to its source's
fallback topic. Values are written as text (numbers as JSON writes them).
"""

from __future__ import annotations

import re

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class Template:
    def __init__(self, text: str):
        self.text = text
        self.fields = tuple(PLACEHOLDER.findall(text))
        self._parts = PLACEHOLDER.split(text)       # literal, field, literal, field, ...

    @property
    def is_static(self) -> bool:
        return not self.fields

    def render(self, fields: dict) -> str | None:
        """The text with each placeholder's field; None when one is absent or null."""
        out = []
        for i, part in enumerate(self._parts):
            if i % 2 == 0:
                out.append(part)
                continue
            value = fields.get(part)
            if value is None:
                return None
            out.append(value if isinstance(value, str) else str(value).lower()
                       if isinstance(value, bool) else str(value))
        return "".join(out)

    def topic(self, fields: dict) -> str | None:
        """The topic this event goes to; None when it makes no name Kafka takes."""
        name = self.render(fields)
        return name if name is not None and TOPIC_NAME.fullmatch(name) else None


def has_placeholders(text: str) -> bool:
    return bool(PLACEHOLDER.search(text))
