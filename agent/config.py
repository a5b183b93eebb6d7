"""The agent's configuration: every setting declared once, with its type, default and help.

Parsing, defaults, validation and the reference in docs/config.md all come from ``SETTINGS``
and ``SOURCE_SETTINGS`` below (``python -m agent.config`` prints the reference). Unknown keys
are errors. An error names the key path, what was expected, what was found, and a hint;
``docket-agent validate`` prints it and exits 78 (EX_CONFIG).
"""

from __future__ import annotations

import codecs
import grp
import json
import math
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docket_common.kafka_security import KafkaSecurity
from docket_common.kafka_security import check_settings as check_security
from docket_common.kafka_security import settings as security_settings
from docket_common.names import AUDIT_TOPIC
from docket_common.settings import (  # noqa: F401  (EX_CONFIG: the agent CLI's exit code)
    EX_CONFIG,
    ConfigError,
    Setting,
    found,
    host_port,
    load_toml,
    parse_sections,
    parse_tables,
    reference_row,
    reference_table,
)
from docket_common.window import window_setting

from .globs import glob_folder
from .patterns import MultilineRule, PatternError

MiB = 1 << 20
UNIT_STOP_TIMEOUT_MS = 45_000        # systemd/docket-agent.service TimeoutStopSec
AUDIT_LAST_ROUND_MS = 8_000          # audit_emitter.STOP_BUDGET_S: the audit's part of a stop


def _hostname() -> str:
    return socket.gethostname()


SETTINGS: tuple[Setting, ...] = (
    Setting("agent.id", str, None, "Agent id, sent as the `docket-origin` header and in audit "
            "records. Default: the host name."),
    Setting("agent.state_dir", str, "/var/lib/docket", "Folder for the state database "
            "(checkpoints), the loss journal, dead letters and quarantined slots."),
    Setting("agent.shutdown_timeout_ms", int, 20000, "On SIGTERM, how long to keep draining "
            "sealed slots to Kafka before exiting; the rest stays in the pool. Not waited for "
            "while the cluster does not answer. With the last audit round (up to 8 s) it must "
            "stay within the unit's `TimeoutStopSec` (45 s).", minimum=0),
    Setting("agent.disk_reserve_bytes", int, 64 << 20, "Free space the state folder's file "
            "system must keep: below it the agent stops reading (files wait, unread) and goes "
            "on sending what the pool holds, until the space is back (the pool file is "
            "preallocated; the state database and the loss journal grow). 0: only a refused "
            "write pauses reading.", minimum=0),
    Setting("agent.origin_header", bool, True, "Add the `docket-origin` header to every record."),
    Setting("agent.record_numbers", bool, True, "Number every record: headers `docket-seq` "
            "(the origin's record number) and `docket-incarnation`, so every tier can count "
            "distinct events and name the missing ones. Needs `agent.origin_header`."),
    Setting("agent.locate_retention_ms", int, 7 * 24 * 3600 * 1000, "How long the map from "
            "record numbers to files and byte ranges (`docket-agent locate`) is kept.",
            minimum=0),
    Setting("buffer.path", str, None, "The pool file. Default: `<state_dir>/buffer.pool`."),
    Setting("buffer.size_bytes", int, 1 << 30, "Size of the preallocated pool file.",
            minimum=2 * 4096),
    Setting("buffer.slot_size_bytes", int, MiB, "Slot size: the batch-size limit; a multiple of "
            "4096. A slot of 64 KiB or more holds the lines of up to 128 files and keeps its "
            "last 8 KiB for their positions; a smaller one, of up to 8 files.", minimum=4096),
    Setting("buffer.linger_ms", float, 5.0, "Seal a slot this long after its first record.",
            minimum=0),
    Setting("buffer.gather_ms", float, 1.0, "When a write wakes an agent with nothing "
            "filling and the last second brought records at least one per two of these "
            "(500 a second at 1 ms), wait this long before reading, deaf to more writes: what "
            "arrives meanwhile is read, shown or sealed, synced and checkpointed with it (one "
            "read, one pair of syncs, one send), for up to this much more latency. Slower, a "
            "write is read at once (the wait would save nothing). Cuts CPU at 1,000–10,000 "
            "lines/s (`docs/performance.md`). 0: read at once.", minimum=0, maximum=1000),
    Setting("buffer.seal_when_idle", bool, True, "Seal a slot before its linger has passed "
            "when nothing of the agent's waits for Kafka (the drain is idle): at low rates "
            "records are sent as soon as they are read."),
    Setting("buffer.seal_when_caught_up", bool, True, "Native send path: seal a slot "
            "before its linger has passed when every file source was read to its end, while "
            "the drain keeps up and fewer than 8 slots are on their way: a record does not "
            "wait for the slot before it to be acknowledged. Off, and always with the Python "
            "path and with `delivery = \"exactly_once\"`: while slots are in flight, records "
            "gather until linger (fewer, larger slots at a steady moderate rate; with exactly "
            "once, a transaction that commits as soon as its records are acknowledged)."),
    Setting("buffer.send_filling", bool, True, "Native send path, at least once: a slot "
            "that would be sealed early (`seal_when_idle`, `seal_when_caught_up`: the agent "
            "read everything) is sent while it fills instead: what it holds is written in its "
            "header as a sealed slot and synced before it is sent, as a seal does, and the "
            "slot is sealed whole (its checkpoints, its audit counts) `seal_every_ms` after its "
            "first record, or when full. At 10–1,000 lines/s one seal's work serves every "
            "line of that time instead of each line (`docs/performance.md`). Off: each such "
            "slot is sealed before it is sent."),
    Setting("buffer.seal_every_ms", float, 1000.0, "How long after its first record a slot "
            "sent while it fills (`send_filling`) is sealed whole: how far the sealed "
            "checkpoints and the audit's counts may lag what Kafka has.",
            minimum=1, maximum=60_000),
    Setting("buffer.on_full", str, "block", "With no free slot: `block` (file sources stop "
            "reading, socket clients wait) or `drop_oldest` (drop the oldest sealed slot, "
            "counted).",
            choices=("block", "drop_oldest")),
    Setting("buffer.oversize", str, "split", "A line longer than a slot: `split` into parts, "
            "`truncate`, or `drop`; each counted.", choices=("split", "truncate", "drop")),
    Setting("buffer.spill_max_bytes", int, 0, "Spill sealed slots snappy-compressed to "
            "`<state_dir>/spill/` up to this many bytes before blocking or dropping (0: off).",
            minimum=0),
    Setting("buffer.sync_on_seal", bool, True, "msync each slot when it is sealed, so sealed data "
            "survives a power loss, not only a crash. Off, a power loss may lose slots not "
            "yet acknowledged: lines their files still hold are read again under new record "
            "numbers (one Kafka took arrives twice), lines the files no longer hold are lost "
            "without a loss-journal entry; no record number is given to two lines either way "
            "(`record-numbers`)."),
    Setting("broker.bootstrap_servers", str, "127.0.0.1:9092", "Kafka bootstrap servers."),
    Setting("broker.compression", str, "snappy", "Kafka compression codec.",
            choices=("none", "gzip", "snappy", "lz4", "zstd")),
    *security_settings("broker"),
    Setting("broker.send_path", str, "auto", "How sealed slots reach Kafka: `native` (the "
            "extension `make setup` builds and the .deb ships: the record loop and the delivery "
            "reports in native code, agent/native), `python` (confluent-kafka, one call per "
            "record), or `auto`: `native` where the extension is installed, `python` where it "
            "is not; the ready line says which runs and why. Both do `delivery = "
            "\"exactly_once\"`. docs/performance.md compares them.",
            choices=("auto", "native", "python")),
    Setting("broker.delivery", str, "at_least_once", "`at_least_once`: after a crash the "
            "slots that were in flight are sent again (duplicates, never loss). "
            "`exactly_once`: slots go in Kafka transactions with the agent's progress marker, "
            "so read_committed consumers see every event once (docs/exactly-once.md), on "
            "either send path.",
            choices=("at_least_once", "exactly_once")),
    Setting("broker.delivered_check_s", float, 30.0, "Native send path, at start: the slots "
            "found in the pool with records past their acknowledged prefix (in flight when the "
            "agent stopped) wait while the agent reads back what Kafka took of their topics "
            "since, for at most this long (a cluster that does not answer yet counts); records "
            "found there under this agent's origin, incarnation and record number, with the "
            "same value, are not sent again (fewer duplicates after a crash; what is not found "
            "is sent again, as without the check). 0: no check. Not with `delivery = "
            "\"exactly_once\"`: the progress marker says what Kafka committed.", minimum=0),
    Setting("broker.transaction_ms", float, 250.0, "`exactly_once`: slots join a transaction "
            "for at most this long; it commits sooner when the agent has caught up. Records "
            "are visible to read_committed consumers at the commit.", minimum=1),
    Setting("broker.transaction_max_slots", int, 32, "`exactly_once`: at most this many slots "
            "in one transaction (the progress marker names each).", minimum=1, maximum=64),
    Setting("broker.transaction_timeout_ms", int, 60_000, "`exactly_once`: Kafka aborts a "
            "transaction of an agent that died after this long, so read_committed consumers "
            "wait at most this long behind it (a restarted agent aborts it at once). Also the "
            "longest a record waits in librdkafka before its transaction is aborted and sent "
            "again.", minimum=1000, maximum=900_000),
    Setting("broker.progress_topic", str, "docket.progress", "`exactly_once`: the topic the "
            "progress marker is committed on (as an offset of the agent's own group, "
            "`docket-agent-<id>`); one partition, nothing is written to it. Created by the "
            "agent when missing and allowed."),
    Setting("broker.librdkafka_options", dict, {}, "librdkafka properties passed to the producer "
            "as they are, e.g. `\"socket.keepalive.enable\" = true`. Security goes in the "
            "`broker.security_protocol` … keys above (docs/security.md): a password is never "
            "written here."),
    Setting("broker.unsafe_weaker_delivery", bool, False, "Accept `librdkafka_options` that "
            "weaken the at-least-once delivery (`acks` other than `all`, "
            "`enable.idempotence = false`): events the default settings keep can then be lost or "
            "reordered. Warned at start and shown in status."),
    Setting("audit.enabled", bool, True, "Count accepted events per (topic, window) and emit "
            "them to the audit topic."),
    Setting("audit.topic", str, AUDIT_TOPIC, "Audit topic the counts are written to."),
    window_setting("audit.window_ms"),
    Setting("audit.interval_ms", int, 600000, "How often audit counts are emitted.", minimum=1000),
    Setting("status.listen", str, "127.0.0.1:9464", "Address of `/metrics` and `/status`."),
)

SOURCE_SETTINGS: tuple[Setting, ...] = (
    Setting("type", str, None, "`file` (tail files), `socket` (unix stream socket), "
            "`syslog` (RFC 5424/3164 over TCP or UDP) or `journald` (the systemd journal's "
            "entries).",
            choices=("file", "socket", "syslog", "journald"), required=True),
    Setting("topic", str, None, "Kafka topic of this source's events; a `syslog` or `journald` "
            "source's may name fields of the event (`\"syslog.{app}\"`, "
            "`\"journal.{_SYSTEMD_UNIT}\"`), a `file` source's fields of the file "
            "(`\"logs.{namespace}\"`, `\"{hostname}.app\"`) and, in a plain file (no "
            "`format`, UTF-8, no `multiline`), any other name a field of each line, a JSON "
            "object (`\"app.{service}\"`: each line to its own topic): see `fallback_topic`.",
            required=True),
    Setting("paths", list, [], "`file`: glob patterns of the files to tail."),
    Setting("exclude", list, [], "`file`: glob patterns of files not to tail though `paths` "
            "match them, e.g. `[\"*.gz\"]` beside `paths = [\"/var/log/app/app.log*\"]`. A "
            "pattern without `/` is matched against the file's name, one with `/` against its "
            "whole path. A file already tailed and renamed to an excluded name is still read "
            "to its end, as any file rotated away. (A compressed file is never read as lines "
            "either way: docs/agent.md, Sources.)"),
    Setting("compressed", str, "skip", "`file`: a gzip, zstd, xz or bzip2 file under the globs "
            "that "
            "is the compressed form of a file the agent was reading (logrotate's `compress`) is "
            "always read on, decompressed, from where reading stopped, and one holding content "
            "never seen (written, rotated and compressed while the agent was stopped) is read "
            "whole; any other compressed file (a copy of content read to its end, an archive "
            "found at the agent's very first start) is `skip`ped (counted, listed in status) "
            "or `read` whole, decompressed.",
            choices=("skip", "read")),
    Setting("path", str, None, "`socket`: path of the unix socket to listen on."),
    Setting("group", str, None, "`socket`: the group given the socket (mode 0660), so its "
            "members may write to it; the agent's user must be one of them. Default: the "
            "agent's own group."),
    Setting("listen", str, None, "`syslog`: address and port to listen on, e.g. "
            "`\"127.0.0.1:5514\"` or `\"[::]:5514\"` (below 1024 the agent's user needs "
            "CAP_NET_BIND_SERVICE)."),
    Setting("protocol", str, "tcp", "`syslog`: `tcp` (RFC 6587: octet-counted or "
            "newline-ended frames, backpressure when the pool is full) or `udp` (one message a "
            "datagram; what the kernel drops is counted and journalled as `udp_dropped`).",
            choices=("tcp", "udp")),
    Setting("journal_directory", str, None, "`journald`: a folder of journal files to "
            "read (journalctl's `--directory`), e.g. the files `systemd-journal-remote` writes; "
            "default: the host's journal (the agent's user must be in the group "
            "`systemd-journal`)."),
    Setting("units", list, [], "`journald`: only entries of these systemd units (journalctl's "
            "`--unit`: a name or a glob, e.g. `[\"nginx.service\", \"app-*.service\"]`)."),
    Setting("identifiers", list, [], "`journald`: only entries with these syslog identifiers "
            "(journalctl's `--identifier`)."),
    Setting("priority", str, None, "`journald`: only entries of this priority or a more "
            "urgent one (`emerg` … `debug`, or 0–7), or of a range (`\"err..warning\"`)."),
    Setting("matches", list, [], "`journald`: further journal matches, `FIELD=value` "
            "(journalctl's own: matches of one field are alternatives, of different fields "
            "all apply; `\"+\"` between two groups takes either)."),
    Setting("format", str, None, "`syslog`: `json` (the default: each message's fields as one "
            "JSON object: facility, severity, timestamp, host, app, procid, msgid, "
            "structured_data, message, protocol, peer) or `raw` (the message as received). "
            "`journald`: `json` (the default: the entry's fields as one JSON object) or "
            "`message` (its `MESSAGE` as written). "
            "`file`: unset (each line as written), or a container runtime's log files: `cri` "
            "(containerd, CRI-O: `/var/log/pods/*/*/*.log`) or `docker` (docker's json-file): "
            "the runtime's framing removed, partial lines joined, each record a JSON object "
            "of time, stream, message and the pod, namespace and container the file's path "
            "names (docs/agent.md, Container logs).",
            choices=("json", "raw", "message", "cri", "docker")),
    Setting("fallback_topic", str, None, "`syslog` with `format = \"json\"`, `journald` and "
            "`file`: when `topic` names fields (`\"syslog.{app}\"`, "
            "`\"logs.{facility}.{severity}\"`, `\"journal.{_SYSTEMD_UNIT}\"`, "
            "`\"pods.{namespace}\"`), the topic of an event whose fields make no topic name "
            "(one absent or null, or characters Kafka refuses); required then."),
    Setting("key", str, None, "`syslog` with `format = \"json\"`, `journald` and `file`: the "
            "record key as a template over the event's fields, e.g. `\"{host}\"`, "
            "`\"{host}/{app}\"` or `\"{_HOSTNAME}\"`; a file's: over its file's fields, e.g. "
            "`\"{namespace}/{pod}\"`, and a plain file's also over its lines' fields, e.g. "
            "`\"{user}\"` (a field absent: no key, counted). Not with `key_field`."),
    Setting("add_fields", dict, None, "`syslog` and `journald` with `format = \"json\"`, and "
            "`file` with `format = \"cri\"` or `\"docker\"`: fields added to every event, e.g. "
            "`{ datacenter = \"eu1\", role = \"edge\" }`; templates may name them. Not the "
            "names the event's own fields have, nor the journal's trusted names (beginning "
            "with `_`)."),
    Setting("receive_buffer_bytes", int, 0, "`syslog`: the socket's receive buffer "
            "(`SO_RCVBUF`; the kernel doubles it and caps it at `net.core.rmem_max`); 0: the "
            "system's default. A larger one rides out bursts over UDP.", minimum=0,
            maximum=2**31 - 1),
    Setting("ssl_certificate_file", str, None, "`syslog` over TCP: PEM file of the listener's "
            "certificate: with `ssl_key_file`, the listener speaks TLS."),
    Setting("ssl_key_file", str, None, "`syslog` over TCP: PEM file of the listener's private "
            "key."),
    Setting("ssl_key_password_file", str, None, "`syslog` over TCP: file holding the private "
            "key's password, if it has one."),
    Setting("ssl_ca_file", str, None, "`syslog` over TCP with TLS: PEM file of the CA that signs "
            "the clients' certificates: every client must then present one (mutual TLS)."),
    Setting("timestamp_field", str, None, "JSON field holding the event time (RFC 3339, epoch "
            "seconds or milliseconds). Absent or unparsable: the read time, counted."),
    Setting("key_field", str, None, "JSON field used as the Kafka record key (`journald`: a "
            "field of the entry, e.g. `_HOSTNAME`)."),
    Setting("read_from", str, "beginning", "`file`: where the files found at the agent's very "
            "first start (no state folder yet) are read from: `beginning`, or `end` (their "
            "last whole line's end: what they held before is not shipped). Files that appear "
            "later, and every file after a lost state, are read from their start. "
            "`journald`: where a source with no checkpoint yet starts: the journal's first "
            "entry, or after its last one.",
            choices=("beginning", "end")),
    Setting("ignore_older_ms", int, 0, "`file`: a file the agent does not know yet and that "
            "was last changed longer ago than this is not opened (counted in status as "
            "`ignored_older`); once it changes it is read from the size it had when it was "
            "first ignored in this run (0: off).", minimum=0),
    Setting("encoding", str, "utf-8", "The source's character encoding: `utf-8`, or any codec "
            "Python names whose newline is the byte 0x0A (`latin-1`, `windows-1252`, "
            "`iso-8859-15`, `shift_jis`, `gb18030`, …); records are transcoded to UTF-8, "
            "undecodable bytes replaced and counted (`invalid_encoding`); offsets and "
            "checkpoints stay in the file's own bytes. `file` sources also read UTF-16 and "
            "UTF-32 (`utf-16`, `utf-16-le`, `utf-16-be`, `utf-32`, …): lines end at a newline "
            "code unit, a byte order mark at the file's start is no part of a record, and "
            "`utf-16`/`utf-32` take the byte order from it (little-endian without one)."),
    Setting("multiline", dict, None, "`file`: lines joined into one event (one record, one "
            "record number), e.g. `{ preset = \"java\" }` (presets: java, python, go, ruby), "
            "`{ start = \"^\\\\d{4}-\\\\d{2}-\\\\d{2} \" }` (a matching line begins an event) "
            "or `{ continue = \"^\\\\s\" }` (a matching line continues the one before); "
            "`flush_ms` (default 1000): an event with no line after it for this long is sent; "
            "`max_event_bytes` (default 1 MiB): an event is cut at a line's end before it grows "
            "past this, counted, the rest sent as records with the header `docket-continued`. "
            "Patterns are RE2 (linear time); docs/agent.md, Multiline events."),
    Setting("read_chunk_bytes", int, MiB, "`file`: bytes read per read call.", minimum=4096),
    Setting("partial_flush_ms", int, 0, "`file`: send a last line without its newline after this "
            "long unchanged (0: wait for the newline).", minimum=0),
    Setting("close_idle_ms", int, 300_000, "`file`: a file read to its end and not written for "
            "this long is closed (its descriptor given back; a deleted one's space comes back) "
            "and opened again when it changes — a write the watch names, or a scan that finds "
            "its size or time changed (0: never closed while under the globs).", minimum=0),
    Setting("max_open_files", int, 0, "`file`: at most this many of the source's files open: "
            "beyond it, the files idle longest are closed (as by `close_idle_ms`); when every "
            "open file is busy the cap is exceeded rather than a file left unread, and status "
            "says so (`files_waiting.over_max_open_files`) (0: no cap).", minimum=0),
    Setting("poll_interval_ms", int, 250, "`file`: polling interval behind the file events "
            "(every 10 s instead while the agent's own watch sees every folder and no file "
            "found waits to be decided on: docs/agent.md, Sources).", minimum=10),
)

@dataclass
class SourceConfig:
    index: int
    type: str
    topic: str
    paths: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    compressed: str = "skip"
    read_from: str = "beginning"
    ignore_older_ms: int = 0
    path: str | None = None
    group: str | None = None
    listen: str | None = None
    journal_directory: str | None = None
    units: list[str] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)
    priority: str | None = None
    matches: list[str] = field(default_factory=list)
    protocol: str = "tcp"
    format: str | None = None          # syslog: None is json (parse fills it in)
    receive_buffer_bytes: int = 0
    fallback_topic: str | None = None
    key: str | None = None
    add_fields: dict | None = None
    ssl_certificate_file: str | None = None
    ssl_key_file: str | None = None
    ssl_key_password_file: str | None = None
    ssl_ca_file: str | None = None
    timestamp_field: str | None = None
    key_field: str | None = None
    encoding: str = "utf-8"
    multiline: dict | None = None
    read_chunk_bytes: int = MiB
    partial_flush_ms: int = 0
    close_idle_ms: int = 300_000
    max_open_files: int = 0
    poll_interval_ms: int = 250

    @property
    def label(self) -> str:
        """The topic the source's own counts and log lines name: a routing source's fallback
        (its ``topic`` is then a template), else its topic."""
        return self.fallback_topic or self.topic


@dataclass
class AgentConfig:
    values: dict[str, Any]
    sources: list[SourceConfig]
    file: Path | None = None
    # (key path, message): what may work later, e.g. a source folder that does not exist yet
    warnings: list[tuple[str, str]] = field(default_factory=list)

    def __getitem__(self, key: str):
        return self.values[key]

    @property
    def security(self) -> KafkaSecurity:
        """How the agent's Kafka clients authenticate (``broker.security_protocol`` …)."""
        return KafkaSecurity.from_values(self.values, "broker")

    @property
    def state_dir(self) -> Path:
        return Path(self.values["agent.state_dir"])

    @property
    def agent_id(self) -> str:
        return self.values["agent.id"]

    @property
    def buffer_path(self) -> Path:
        return Path(self.values["buffer.path"])

    # What the agent keeps in ``state_dir``, named here alone (docs/agent.md).
    @property
    def state_db_path(self) -> Path:
        """The SQLite database: file positions, record-number map, producer tallies."""
        return self.state_dir / "state.db"

    @property
    def journal_path(self) -> Path:
        """The loss journal (``agent.state.journal``)."""
        return self.state_dir / "loss-journal.jsonl"

    @property
    def numbers_path(self) -> Path:
        """Record numbers reserved ahead, with ``sync_on_seal`` off (``agent.state.numbers``)."""
        return self.state_dir / "record-numbers"

    @property
    def spill_dir(self) -> Path:
        return self.state_dir / "spill"

    @property
    def quarantine_dir(self) -> Path:
        return self.state_dir / "quarantine"

    @property
    def dead_letter_dir(self) -> Path:
        return self.state_dir / "dead-letter"


def parse(raw: dict, file: Path | None = None) -> AgentConfig:
    """Validate a parsed TOML document and fill in defaults."""
    values = parse_sections(raw, SETTINGS, other_sections=("sources",))
    values["agent.id"] = values["agent.id"] or _hostname()
    values["buffer.path"] = values["buffer.path"] or str(
        Path(values["agent.state_dir"]) / "buffer.pool")
    for key, value in values["broker.librdkafka_options"].items():
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(f"broker.librdkafka_options.{key}",
                              f"expected a string, number or boolean, found {found(value)}")
    check_security(values, "broker", "broker.librdkafka_options")
    weakened = weakened_delivery(values["broker.librdkafka_options"])
    if weakened and not values["broker.unsafe_weaker_delivery"]:
        key, why = weakened[0]
        raise ConfigError(f"broker.librdkafka_options.{key}", why,
                          hint="remove it (the agent sets acks=all and idempotence itself), or "
                          "accept the risk with [broker] unsafe_weaker_delivery = true")
    sources = _parse_sources(raw.get("sources", []))
    _check_combinations(values, sources)
    warnings = _warnings(sources)
    if values["agent.shutdown_timeout_ms"] + AUDIT_LAST_ROUND_MS > UNIT_STOP_TIMEOUT_MS:
        warnings.append(("agent.shutdown_timeout_ms", f"{values['agent.shutdown_timeout_ms']} ms "
                         f"plus the last audit round (up to {AUDIT_LAST_ROUND_MS} ms) exceeds "
                         f"the packaged unit's TimeoutStopSec ({UNIT_STOP_TIMEOUT_MS // 1000} "
                         "s): systemd would kill the agent mid-drain (the pool keeps the data); "
                         "raise TimeoutStopSec in a drop-in"))
    warnings += [(f"broker.librdkafka_options.{key}", f"{why} (accepted: "
                  "broker.unsafe_weaker_delivery = true)") for key, why in weakened]
    return AgentConfig(values, sources, file, warnings)


def weakened_delivery(options: dict) -> list[tuple[str, str]]:
    """The librdkafka options that break at-least-once, in-order delivery: (key, why)."""
    out = []
    for key, value in options.items():
        text = str(value).strip().lower()
        if key in ("acks", "request.required.acks") and text not in ("all", "-1"):
            out.append((key, f"acks = {value!r} acknowledges a record before every in-sync "
                        "replica has it: a broker failure then loses acknowledged events"))
        if key == "enable.idempotence" and text in ("false", "f", "0", "no", "off"):
            out.append((key, "enable.idempotence = false lets a retry duplicate or reorder "
                        "records"))
    return out


def _warnings(sources: list[SourceConfig]) -> list[tuple[str, str]]:
    """A source folder that does not exist yet: an agent started at boot before its
    application must come up and pick the files up once the folder appears (it is watched)."""
    out = []
    for src in sources:
        for j, pattern in enumerate(src.paths):
            folder = glob_folder(pattern)
            if not folder.exists():
                out.append((f"sources[{src.index}].paths[{j}]",
                            f"folder {folder} does not exist yet; watched until it appears"))
    return out


def _parse_sources(raw_sources) -> list[SourceConfig]:
    tables = parse_tables(raw_sources, "sources", SOURCE_SETTINGS, "a source",
                          hint="write each source as a [[sources]] block")
    out = []
    for i, vals in enumerate(tables):
        where = f"sources[{i}]"
        src = SourceConfig(index=i, **vals)
        _check_encoding(f"{where}.encoding", src.encoding, wide=src.type == "file")
        _check_format(where, src)
        if src.type == "file":
            if not src.paths:
                raise ConfigError(f"{where}.paths", "a file source needs at least one glob",
                                  hint='e.g. paths = ["/var/log/app/*.log"]')
            if src.path is not None or src.group is not None:
                key = "path" if src.path is not None else "group"
                raise ConfigError(f"{where}.{key}", f"only socket sources take `{key}`",
                                  hint="file sources take `paths`, a list of globs")
            for j, pattern in enumerate(src.paths):
                _check_glob(f"{where}.paths[{j}]", pattern)
            for j, pattern in enumerate(src.exclude):
                if not isinstance(pattern, str) or not pattern:
                    raise ConfigError(f"{where}.exclude[{j}]",
                                      f"expected a glob pattern, found {pattern!r}",
                                      hint='e.g. exclude = ["*.gz", "*.zst"]')
            if src.multiline is not None:
                _check_multiline(f"{where}.multiline", src.multiline)
        if src.type == "socket":
            if "{" in src.topic:
                raise ConfigError(f"{where}.topic", "a socket source does not route by field "
                                  "(a topic naming fields)", hint="give the topic's name")
            for key in ROUTING:
                if getattr(src, key) != SourceConfig.__dataclass_fields__[key].default:
                    raise ConfigError(f"{where}.{key}", f"a socket source does not take "
                                      f"`{key}`")
        elif src.type == "file":
            _check_routing(where, src)
        if src.type != "syslog":
            for key in SYSLOG_ONLY:
                if getattr(src, key) != SourceConfig.__dataclass_fields__[key].default:
                    raise ConfigError(f"{where}.{key}", f"only syslog sources take `{key}`")
        if src.type != "journald":
            for key in JOURNALD_ONLY:
                if getattr(src, key) not in (None, []):
                    raise ConfigError(f"{where}.{key}", f"only journald sources take `{key}`")
        if src.type == "syslog":
            _check_syslog(where, src)
        elif src.type == "journald":
            _check_journald(where, src)
        elif src.type == "socket":
            if src.multiline is not None:
                raise ConfigError(f"{where}.multiline", "only file sources take `multiline`",
                                  hint="a socket's writer sends each event as one line")
            if not src.path:
                raise ConfigError(f"{where}.path", "a socket source needs the socket's path",
                                  hint='e.g. path = "/run/docket/events.sock"')
            if src.paths or src.exclude:
                key = "paths" if src.paths else "exclude"
                raise ConfigError(f"{where}.{key}", f"only file sources take `{key}`")
            if src.read_from != "beginning" or src.ignore_older_ms or src.compressed != "skip" \
                    or src.max_open_files:
                key = "read_from" if src.read_from != "beginning" else \
                    "ignore_older_ms" if src.ignore_older_ms else \
                    "compressed" if src.compressed != "skip" else "max_open_files"
                raise ConfigError(f"{where}.{key}", f"only file sources take `{key}`")
            if src.group is not None:
                try:
                    grp.getgrnam(src.group)
                except KeyError:
                    raise ConfigError(f"{where}.group", f"no group named {src.group!r}",
                                      hint="create it (groupadd) and add the agent's user and "
                                      "the socket's writers to it") from None
            parent = Path(src.path).parent
            if not parent.is_dir():
                raise ConfigError(f"{where}.path", f"folder {parent} does not exist",
                                  hint="create it, or choose another socket path")
        out.append(src)
    topics_by_socket = [s.path for s in out if s.type == "socket"]
    if len(topics_by_socket) != len(set(topics_by_socket)):
        raise ConfigError("sources", "two socket sources share one path")
    journals = [json.dumps([s.journal_directory, s.topic, s.units, s.identifiers, s.priority,
                            s.matches]) for s in out if s.type == "journald"]
    if len(journals) != len(set(journals)):
        raise ConfigError("sources", "two journald sources read the same entries of one "
                          "journal into one topic", hint="give them other topics or filters, "
                          "or keep one")
    listeners = [(s.protocol, split_listen(s.listen)) for s in out if s.type == "syslog"]
    if len(listeners) != len(set(listeners)):
        raise ConfigError("sources", "two syslog sources listen on one address and protocol")
    return out


# What only a syslog source takes (any other source given one is refused).
SYSLOG_ONLY = ("listen", "protocol", "receive_buffer_bytes", "ssl_certificate_file",
               "ssl_key_file", "ssl_key_password_file", "ssl_ca_file")
# Routing by field: what the syslog, journald and file sources take.
ROUTING = ("fallback_topic", "key", "add_fields")
# A file's own fields, for a file source's templates (agent/routing.py ``FileRoutes``): this
# host's name; with a container runtime's format, what the file's path names
# (agent/tail/container.py ``path_fields``) and the record's own fields (not for templates).
FILE_FIELDS = ("hostname",)
CONTAINER_PATH_FIELDS = ("namespace", "pod", "pod_uid", "container", "restart", "container_id")
CONTAINER_RECORD_FIELDS = ("time", "stream", "message")
# The container runtimes' log formats a file source takes (agent/tail/container.py).
CONTAINER_FORMATS = ("cri", "docker")
# The fields of a syslog message's JSON form (agent/tail/syslog_format.py, and its peer).
SYSLOG_FIELDS = ("facility", "severity", "timestamp", "host", "app", "procid", "msgid",
                 "structured_data", "message", "protocol", "peer", "parse_error")
# What a syslog source does not take.
NOT_SYSLOG = ("paths", "exclude", "path", "group", "multiline", "read_from", "ignore_older_ms",
              "encoding", "compressed", "max_open_files", "partial_flush_ms")


def split_listen(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 address]:port`` as (host, port); ValueError when it is neither."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, [::1]:5514")
    return host, int(port)


def _check_routing(where: str, src: SourceConfig) -> None:
    """A syslog, journald or file source's templates (``topic``, ``key``), its fallback topic
    and added fields. A journald entry's fields are its own (any name): only a syslog's or a
    file's template's fields are checked by name; templates over a journal entry take its
    fields in either format, added fields need the JSON form. A file's templates name its
    file's fields (``FILE_FIELDS``, and a container runtime's path fields); its added fields
    need a container runtime's format (a plain file's lines are shipped as written)."""
    from .routing import PLACEHOLDER, TOPIC_NAME, Template, has_placeholders

    routed = has_placeholders(src.topic)
    journald = src.type == "journald"
    file = src.type == "file"
    container = file and src.format in CONTAINER_FORMATS
    if file:
        if src.add_fields is not None and not container:
            raise ConfigError(f"{where}.add_fields", "a plain file's lines are shipped as "
                              "written: only a container runtime's records (made as JSON) "
                              "take added fields", hint='format = "cri" or "docker", or '
                              "leave add_fields out")
        own = set(FILE_FIELDS) | (set(CONTAINER_PATH_FIELDS) if container else set())
        taken = own | (set(CONTAINER_RECORD_FIELDS) if container else set())
    else:
        json_only = [k for k, on in (("topic", routed and not journald),
                                     ("key", src.key is not None and not journald),
                                     ("add_fields", src.add_fields is not None)) if on]
        if json_only and src.format != "json":
            raise ConfigError(f"{where}.{json_only[0]}", "templates and added fields need "
                              "the message's fields", hint='set format = "json"')
        own = taken = set(SYSLOG_FIELDS)
    added = src.add_fields or {}
    for name, value in added.items():
        if name in taken and not journald:
            raise ConfigError(f"{where}.add_fields.{name}", "is a field of every "
                              f"{'record' if file else 'syslog message'}",
                              hint="choose another name")
        if journald and name.startswith("_"):
            raise ConfigError(f"{where}.add_fields.{name}", "a name beginning with '_' is the "
                              "journal's own (trusted fields)", hint="choose another name")
        if not isinstance(value, str | int | float | bool) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise ConfigError(f"{where}.add_fields.{name}", f"expected text, a number or a "
                              f"boolean, found {value!r}")
    for key, text in (("topic", src.topic), ("key", src.key)):
        if text is None:
            continue
        literal = PLACEHOLDER.sub("", text)
        if "{" in literal or "}" in literal:
            raise ConfigError(f"{where}.{key}", f"{text!r}: a brace that is no placeholder "
                              "(a field's name: letters, digits and '_')",
                              hint='e.g. "syslog.{app}"')
        if key == "topic" and literal and not TOPIC_NAME.fullmatch(literal):
            raise ConfigError(f"{where}.topic", f"{text!r} is not a Kafka topic name",
                              hint="letters, digits, '.', '_', '-' besides its placeholders")
    known = own | set(added)
    for key, text in (("topic", src.topic), ("key", src.key)):
        if text is None or journald:
            continue
        unknown = [f for f in Template(text).fields if f not in known]
        if unknown and file and not container:
            # a plain file's template may name fields of its lines: each line a JSON object
            if src.multiline:
                raise ConfigError(f"{where}.{key}", f"{{{unknown[0]}}} is a field of a line "
                                  "(a JSON object): a multiline event is no line to route by",
                                  hint="leave multiline out, or name only "
                                       + ", ".join(sorted(known)))
            if codecs.lookup(src.encoding).name != "utf-8":
                raise ConfigError(f"{where}.{key}", f"{{{unknown[0]}}} is a field of a line "
                                  "(a JSON object): routing by a line's fields reads UTF-8",
                                  hint="leave encoding out")
        elif unknown:
            raise ConfigError(f"{where}.{key}", f"{{{unknown[0]}}} is not a field of the "
                              f"{'file' if file else 'message'}",
                              hint="fields: " + ", ".join(sorted(known)))
    if src.key is not None and src.key_field:
        raise ConfigError(f"{where}.key", "give `key` or `key_field`, not both")
    if routed and not src.fallback_topic:
        raise ConfigError(f"{where}.fallback_topic", f"topic {src.topic!r} names fields: a "
                          "message they make no topic for needs a fallback topic",
                          hint='e.g. fallback_topic = "syslog.other"')
    if src.fallback_topic is not None:
        if not routed:
            raise ConfigError(f"{where}.fallback_topic", "only a topic that names fields "
                              "takes a fallback", hint='e.g. topic = "syslog.{app}"')
        if not TOPIC_NAME.fullmatch(src.fallback_topic):
            raise ConfigError(f"{where}.fallback_topic", f"{src.fallback_topic!r} is not a "
                              "Kafka topic name", hint="letters, digits, '.', '_', '-'")


def _check_format(where: str, src: SourceConfig) -> None:
    """Which ``format`` a source of its type takes; a syslog source's unset one is json."""
    taken = {"syslog": ("json", "raw"), "file": CONTAINER_FORMATS, "socket": (),
             "journald": ("json", "message")}[src.type]
    if src.type in ("syslog", "journald") and src.format is None:
        src.format = "json"
    if src.format is not None and src.format not in taken:
        raise ConfigError(f"{where}.format", f"a {src.type} source does not take format "
                          f"{src.format!r}", hint=("choose one of " + ", ".join(taken))
                          if taken else "leave it out: a socket's records are its lines")
    if src.format in CONTAINER_FORMATS:
        if codecs.lookup(src.encoding).name != "utf-8":
            raise ConfigError(f"{where}.encoding", f"a {src.format} file is UTF-8 (the "
                              "runtime's framing is)", hint="leave encoding out")
        if src.timestamp_field:
            raise ConfigError(f"{where}.timestamp_field", f"a {src.format} record's event "
                              "time is the runtime's time of its first line",
                              hint="leave timestamp_field out")
        if src.partial_flush_ms:
            raise ConfigError(f"{where}.partial_flush_ms", f"a {src.format} file's lines are "
                              "whole when the runtime writes them: a half-written one is "
                              "waited for", hint="leave partial_flush_ms out")


def _check_syslog(where: str, src: SourceConfig) -> None:
    for key in NOT_SYSLOG:
        if getattr(src, key) != SourceConfig.__dataclass_fields__[key].default \
                and getattr(src, key) != []:
            raise ConfigError(f"{where}.{key}", f"a syslog source does not take `{key}`",
                              hint="it listens on `listen` with `protocol`")
    if not src.listen:
        raise ConfigError(f"{where}.listen", "a syslog source needs an address to listen on",
                          hint='e.g. listen = "127.0.0.1:5514"')
    try:
        host, _port = split_listen(src.listen)
        socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP, flags=socket.AI_NUMERICHOST)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{where}.listen", f"{src.listen!r} is not an address and port "
                          f"({exc})", hint='e.g. "127.0.0.1:5514", "0.0.0.0:514" or '
                          '"[::1]:5514" (an IP address: names are not looked up)') from None
    if src.format == "raw" and (src.timestamp_field or src.key_field):
        key = "timestamp_field" if src.timestamp_field else "key_field"
        raise ConfigError(f"{where}.{key}", f"`{key}` names a JSON field: a raw syslog record "
                          "is not JSON", hint='set format = "json" (fields such as host, app, '
                          'timestamp), or leave it out')
    _check_routing(where, src)
    tls = [k for k in ("ssl_certificate_file", "ssl_key_file", "ssl_key_password_file",
                       "ssl_ca_file") if getattr(src, k)]
    if tls and src.protocol != "tcp":
        raise ConfigError(f"{where}.{tls[0]}", "TLS needs protocol = \"tcp\"")
    if tls and not (src.ssl_certificate_file and src.ssl_key_file):
        missing = "ssl_key_file" if src.ssl_certificate_file else "ssl_certificate_file"
        raise ConfigError(f"{where}.{missing}", "a TLS listener needs both "
                          "ssl_certificate_file and ssl_key_file")
    for key in tls:
        if not Path(getattr(src, key)).is_file():
            raise ConfigError(f"{where}.{key}", f"no file {getattr(src, key)}")


# What only a journald source takes.
JOURNALD_ONLY = ("journal_directory", "units", "identifiers", "priority", "matches")
# What a journald source does not take (besides the syslog source's own).
NOT_JOURNALD = ("paths", "exclude", "path", "group", "multiline", "ignore_older_ms", "encoding",
                "compressed", "max_open_files", "partial_flush_ms", "timestamp_field")
PRIORITIES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")
JOURNAL_FIELD = re.compile(r"[A-Z0-9_]+")


def _check_journald(where: str, src: SourceConfig) -> None:
    for key in NOT_JOURNALD:
        if getattr(src, key) != SourceConfig.__dataclass_fields__[key].default \
                and getattr(src, key) != []:
            raise ConfigError(f"{where}.{key}", f"a journald source does not take `{key}`",
                              hint="it reads the journal: filter with units, identifiers, "
                              "priority or matches" if key != "timestamp_field" else
                              "an entry's event time is its __REALTIME_TIMESTAMP")
    for key in ("units", "identifiers"):
        for j, name in enumerate(getattr(src, key)):
            if not isinstance(name, str) or not name.strip():
                raise ConfigError(f"{where}.{key}[{j}]", f"expected a name, found {name!r}",
                                  hint='e.g. units = ["nginx.service"]')
    if src.priority is not None:
        ends = str(src.priority).split("..")
        if len(ends) > 2 or not all(e in PRIORITIES or e in "01234567" and len(e) == 1
                                    for e in ends):
            raise ConfigError(f"{where}.priority", f"{src.priority!r} is not a priority or a "
                              "range of them", hint="one of " + ", ".join(PRIORITIES) +
                              ' or 0-7, or a range such as "err..warning"')
    for j, match in enumerate(src.matches):
        name, sep, _value = match.partition("=") if isinstance(match, str) else ("", "", "")
        if match != "+" and not (sep and JOURNAL_FIELD.fullmatch(name)):
            raise ConfigError(f"{where}.matches[{j}]", f"{match!r} is not FIELD=value or \"+\"",
                              hint='e.g. matches = ["_TRANSPORT=stdout"] (field names: '
                              "capitals, digits and '_')")
    if src.journal_directory is not None and not Path(src.journal_directory).is_dir():
        raise ConfigError(f"{where}.journal_directory", f"no folder {src.journal_directory}",
                          hint="leave it out to read the host's journal")
    _check_routing(where, src)


# Encodings whose newline is a code unit of 2 or 4 bytes: a file source finds lines among units.
WIDE_ENCODINGS = {"utf-16": 2, "utf-16-le": 2, "utf-16-be": 2,
                  "utf-32": 4, "utf-32-le": 4, "utf-32-be": 4}


def _check_encoding(where: str, name: str, wide: bool) -> None:
    """``wide``: the source can read UTF-16 and UTF-32 (a file source)."""
    try:
        codec = codecs.lookup(name)
    except LookupError:
        raise ConfigError(where, f"no codec named {name!r}",
                          hint="e.g. utf-8, latin-1, windows-1252 (Python's codec names)") from None
    if wide and codec.name in WIDE_ENCODINGS:
        return
    try:
        newline_is_a_byte = "\n\r a".encode(codec.name) == b"\n\r a"
    except (UnicodeError, LookupError):
        newline_is_a_byte = False
    if not newline_is_a_byte:
        also = " (a file source reads UTF-16 and UTF-32; this source is no file)" \
            if codec.name in WIDE_ENCODINGS else ""
        raise ConfigError(where, f"{name!r} does not write a newline as the byte 0x0A: lines "
                          f"cannot be found in it{also}",
                          hint="convert the log to UTF-8 where it is written (iconv, or the "
                          "application's logging settings)")


def _check_multiline(where: str, table: dict) -> None:
    """The rule is built from the table again where it runs (``tail/reader.py``)."""
    try:
        MultilineRule.from_table(table)
    except PatternError as exc:
        raise ConfigError(f"{where}.{exc.key}" if exc.key else where, str(exc),
                          hint='e.g. multiline = { preset = "java" } or { start = "^\\d{4}-" }'
                          ) from None


def _check_glob(path: str, pattern: str) -> None:
    if not os.path.isabs(pattern):
        raise ConfigError(path, f"expected an absolute path, found {pattern!r}",
                          hint="relative globs would depend on the agent's working folder")
    folder = glob_folder(pattern)          # the last folder free of wildcards
    if folder.exists() and not folder.is_dir():
        raise ConfigError(path, f"{folder} is not a folder", hint="fix the glob")
    if folder.exists() and not os.access(folder, os.R_OK | os.X_OK):
        raise ConfigError(path, f"folder {folder} is not readable by this user",
                          hint="grant the agent's user read and execute permission on it")


def _check_combinations(values: dict, sources: list[SourceConfig]) -> None:
    slot, size = values["buffer.slot_size_bytes"], values["buffer.size_bytes"]
    if slot % 4096:
        raise ConfigError("buffer.slot_size_bytes", f"must be a multiple of 4096, found {slot}",
                          hint=f"use {slot - slot % 4096 or 4096} or {slot - slot % 4096 + 4096}")
    if slot * 2 + 8192 + 1024 > size:
        raise ConfigError("buffer.slot_size_bytes",
                          f"slots of {slot} bytes leave fewer than 2 in a pool of {size} bytes",
                          hint="raise buffer.size_bytes or lower buffer.slot_size_bytes")
    if host_port(values["status.listen"]) is None:
        raise ConfigError("status.listen", f"expected HOST:PORT, found {values['status.listen']!r}",
                          hint='e.g. "127.0.0.1:9464"')
    if values["audit.interval_ms"] > values["audit.window_ms"] * 6:
        raise ConfigError("audit.interval_ms", "emitting less often than every 6 windows leaves "
                          "the reconciler blind", hint="keep interval_ms <= 6 * window_ms")
    for i, src in enumerate(sources):
        if src.topic == values["audit.topic"]:
            raise ConfigError(f"sources[{i}].topic", f"{src.topic!r} is the audit topic",
                              hint="events and audit counts need topics of their own; change "
                              "the source's topic or [audit] topic")
    if not values["broker.bootstrap_servers"].strip():
        raise ConfigError("broker.bootstrap_servers", "must not be empty")
    if not sources:
        raise ConfigError("sources", "no [[sources]] configured",
                          hint="add a [[sources]] block with type, topic and paths")


def to_toml(values: dict[str, Any], sources: list[dict[str, Any]] = ()) -> str:
    """A config file for ``values`` (dotted keys of ``SETTINGS``) and ``sources`` (tables of
    ``SOURCE_SETTINGS`` keys), as a tool writes one (the demo): a key that is not declared is
    an error here, not a file the agent refuses later, and the text is parsed back through
    ``parse`` before it is returned."""
    import tomllib

    declared = {s.key for s in SETTINGS}
    sections: dict[str, list[str]] = {}
    for key, value in values.items():
        if key not in declared:
            raise ConfigError(key, "is not a setting of the agent",
                              hint="docs/config.md lists them")
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"{name} = {_toml_value(value)}")
    out = [f"[{section}]\n" + "\n".join(lines) + "\n" for section, lines in sections.items()]
    source_keys = {s.key for s in SOURCE_SETTINGS}
    for i, table in enumerate(sources):
        unknown = set(table) - source_keys
        if unknown:
            raise ConfigError(f"sources[{i}].{sorted(unknown)[0]}", "is not a source setting",
                              hint="docs/config.md lists them")
        out.append("[[sources]]\n" + "".join(f"{k} = {_toml_value(v)}\n"
                                              for k, v in table.items()))
    text = "\n".join(out)
    parse(tomllib.loads(text))
    return text


DEFAULT_SOURCE = {"type": "file", "paths": ["/var/log/app/*.log"], "topic": "app.events"}
EXAMPLE_SYSLOG_SOURCE = {"type": "syslog", "listen": "127.0.0.1:5514", "protocol": "tcp",
                         "topic": "syslog.events"}
EXAMPLE_JOURNALD_SOURCE = {"type": "journald", "topic": "journal.events",
                           "units": ["nginx.service"], "priority": "info"}


def default_toml() -> str:
    """The configuration a package installs (``/etc/docket/agent.toml``): one source to edit,
    and every other setting, commented out, with its meaning and its default. Written from
    the declarations, so it never lists a key the agent does not have; parsed back here."""
    import textwrap
    import tomllib

    out = ["# docket-agent configuration. Every setting is listed with its default, commented",
           "# out; uncomment to change. Check with: docket-agent validate --config FILE",
           "# Reference: /usr/share/doc/docket-agent/config.md", ""]
    section = None
    for s in SETTINGS:
        head, name = s.key.split(".", 1)
        if head != section:
            section = head
            out += [f"[{section}]"]
        out += ["# " + line for line in textwrap.wrap(s.help.replace("`", ""), 94)]
        if s.default is None:
            out += [f"# {name} =" + ("   # default: the host name" if s.key == "agent.id"
                                      else "")]
        else:
            out += [f"# {name} = {_toml_value(s.default)}"]
        out += [""]
    out += ["# One block per source: the files to tail and the topic they go to.", "[[sources]]"]
    out += [f"{k} = {_toml_value(v)}" for k, v in DEFAULT_SOURCE.items()]
    for s in SOURCE_SETTINGS:
        if s.key not in DEFAULT_SOURCE:
            out += ["# " + line for line in textwrap.wrap(s.help.replace("`", ""), 94)]
            out += [f"# {s.key} =" if s.default in (None, []) else
                    f"# {s.key} = {_toml_value(s.default)}"]
    out += ["", "# A syslog listener as another source (services that log to a local relay), e.g.:",
            "# [[sources]]"]
    out += [f"# {k} = {_toml_value(v)}" for k, v in EXAMPLE_SYSLOG_SOURCE.items()]
    out += ["", "# The systemd journal as another source (services that log to journald), e.g.:",
            "# [[sources]]"]
    out += [f"# {k} = {_toml_value(v)}" for k, v in EXAMPLE_JOURNALD_SOURCE.items()]
    text = "\n".join(out) + "\n"
    parse(tomllib.loads(text))
    return text


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):          # a TOML basic string: JSON's escapes are TOML's
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}"
                               for k, v in value.items()) + "}"
    raise ConfigError("", f"cannot write {found(value)} as TOML")


def load(path: str | Path) -> AgentConfig:
    return parse(load_toml(path), Path(path))


def reference_markdown() -> str:
    """docs/config.md, generated from the declarations."""
    lines = ["# Agent configuration reference", "",
             "Generated from `agent/config.py` by `python -m agent.config`; do not edit by hand.",
             "The file is TOML. Unknown keys are errors; `docket-agent validate --config FILE`",
             "checks a file and exits 78 with the key path and a hint when it is wrong.", ""]
    lines += reference_table(SETTINGS)
    lines += ["", "## [[sources]]", "", "One block per source.", "",
              "| key | type | default | meaning |", "|---|---|---|---|"]
    lines += [reference_row(s.key, s) for s in SOURCE_SETTINGS]
    return "\n".join(lines) + "\n"


def source_topics(sources) -> list[str]:
    """The topics of the configured sources: each gets an audit heartbeat (a source that routes
    by field: its fallback topic; the topics it routes to are known as events arrive)."""
    return sorted({s.fallback_topic or s.topic for s in sources})


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
