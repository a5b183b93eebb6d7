"""Topic and key templates over an event's fields: ``"syslog.{app}"``, ``"{host}"``.

A template is text with ``{field}`` placeholders (a field name: letters, digits, ``_``). It
renders when every field it names is present and not null; a topic must then also be a name
Kafka takes (``[A-Za-z0-9._-]``, 1–249 characters), else the event goes to its source's
fallback topic. Values are written as text (numbers as JSON writes them).
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass

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


def topic_groups(topics: list[str]) -> list[tuple[str, list[int], int]]:
    """A batch's records by the topic each goes to, in the order the topics first come: (topic,
    its records' indices, the first index of the next topic's group, or the batch's length) —
    what a source handing a batch to its topics one after another appends each time, and the
    first record still to come (its ``pending`` position)."""
    groups: dict[str, list[int]] = {}
    for i, topic in enumerate(topics):
        groups.setdefault(topic, []).append(i)
    firsts = [idx[0] for idx in groups.values()][1:] + [len(topics)]
    return [(topic, idx, later)
            for (topic, idx), later in zip(groups.items(), firsts, strict=True)]


@dataclass(frozen=True)
class FileRoute:
    """Where a file's records go: its topic (``fallback``: the source's fallback topic, for
    the file's fields made none), its records' key (None: none, ``key_unmatched`` when a
    template made none) and the fields its records gain (a container runtime's records)."""

    topic: str
    fallback: bool
    key: bytes | None
    key_unmatched: bool
    meta: dict


class FileRoutes:
    """A file source's topic and key per file, from templates over the file's own fields:
    ``hostname`` (this host's name), what a container runtime's path names (``fields_of``:
    namespace, pod, container, ...) and the source's added fields. Fixed per file, so all of a
    file's records go to one topic and a file fills one slot at a time, as an unrouted one
    does; worked out once per path. A template that names other fields (``own``: the file's
    fields, those above) routes each line by them: a line is a JSON object, and its fields
    fill the template's other placeholders (``by_line``, ``of_lines``)."""

    CACHED = 4096

    def __init__(self, topic: str, fallback: str | None, key: str | None,
                 added: dict | None, fields_of=None, hostname: str | None = None,
                 own: frozenset | None = None):
        self._topic = Template(topic)
        self._fallback = fallback
        self._key = Template(key) if key is not None else None
        self._added = dict(added or {})
        self._fields_of = fields_of
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self._cache: dict[str, FileRoute] = {}
        named = set(self._topic.fields) | set(self._key.fields if self._key else ())
        self.by_line = own is not None and bool(named - own - set(self._added))

    def of_lines(self, path: str, values: list[bytes]
                 ) -> tuple[list[str], list[bytes | None] | None, list[bool], list[bool],
                            list[bool]]:
        """Per line (``values``, each a record's bytes) of a file routed by its lines' fields:
        its topic and key (None: no key template), whether it went to the fallback topic,
        whether the key template made no key of it, and whether it is no JSON object (its
        fields are then the file's alone). A field of the file's own is the file's, whatever
        the line holds."""
        file_fields = {"hostname": self.hostname, **self.of(path).meta}
        topics: list[str] = []
        keys: list[bytes | None] | None = [] if self._key is not None else None
        to_fallback, unmatched, not_json = [], [], []
        for value in values:
            try:
                obj = json.loads(value)
            except (ValueError, RecursionError):     # not JSON, not UTF-8, nested too deep
                obj = None
            not_json.append(not isinstance(obj, dict))
            fields = {**obj, **file_fields} if isinstance(obj, dict) else file_fields
            topic = self._topic.topic(fields)
            to_fallback.append(topic is None)
            topics.append(self._fallback if topic is None else topic)
            rendered = self._key.render(fields) if self._key is not None else None
            unmatched.append(self._key is not None and rendered is None)
            if keys is not None:
                keys.append(None if rendered is None else rendered.encode())
        return topics, keys, to_fallback, unmatched, not_json

    def of(self, path: str) -> FileRoute:
        route = self._cache.get(path)
        if route is None:
            if len(self._cache) >= self.CACHED:
                self._cache.clear()
            route = self._cache[path] = self._route(path)
        return route

    def _route(self, path: str) -> FileRoute:
        own = self._fields_of(path) if self._fields_of is not None else {}
        meta = {**own, **self._added}
        fields = {"hostname": self.hostname, **meta}
        topic = self._topic.text if self._topic.is_static else self._topic.topic(fields)
        key, unmatched = None, False
        if self._key is not None:
            rendered = self._key.render(fields)
            unmatched = rendered is None
            key = None if unmatched else rendered.encode()
        return FileRoute(topic or self._fallback, topic is None, key, unmatched, meta)
