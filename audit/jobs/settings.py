"""The Spark jobs' settings (``docket-audit count`` and ``land``), declared once like the agent's
and the reconciler's: each is a command-line flag and a key of the ``[job]`` table of
``--config FILE`` (a flag given wins over the file), checked by the same machinery (exit 78
with the key's path and a hint), and documented by ``reference_markdown`` in
docs/jobs-config.md. The file may hold the cluster's ``[kafka]`` sign-in too (as
``--kafka-config``'s file does: docs/security.md).

No PySpark here: the CLI parses and checks a job's settings before Spark starts.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from docket_common.kafka_security import KafkaSecurity, read_kafka_config
from docket_common.names import AUDIT_TOPIC
from docket_common.settings import (
    ConfigError,
    Setting,
    load_toml,
    parse_sections,
    reference_table,
)
from docket_common.window import window_setting

SECTION = "job"
KAFKA_NAME = re.compile(r"[A-Za-z0-9._-]+")     # a topic's name; a cluster's (its tier)
JOB_SETTINGS: tuple[Setting, ...] = (
    Setting("job.bootstrap_servers", str, None, "The Kafka cluster to read (HOST:PORT, comma "
            "separated).", required=True),
    Setting("job.audit_topic", str, AUDIT_TOPIC, "The audit topic the job's counts go to."),
    Setting("job.audit_bootstrap_servers", str, None, "Where the audit topic lives (default: "
            "the cluster read)."),
    Setting("job.topics", str, ".*", "Java regex of the data topics to read (the audit topic "
            "and Kafka's internal topics are always left out)."),
    window_setting("job.window_ms"),
    Setting("job.trigger_s", float, 60.0, "Seconds between micro-batches (each emits the "
            "changed windows); above 0."),
    Setting("job.once", bool, False, "Process what the topics hold now, emit, and exit."),
    Setting("job.checkpoint_dir", str, None, "Where the job keeps its offsets and state (keep "
            "it: it is what makes a restart exact). Default: count's under the audit's state "
            "folder, land's in the warehouse's `_checkpoint`. In the file, a relative path is "
            "taken from the file's folder."),
    Setting("job.master", str, "local[*]", "Spark master (local[*], spark://..., yarn, "
            "k8s://...)."),
    Setting("job.starting_offsets", str, "earliest", "Where a job without a checkpoint starts.",
            choices=("earliest", "latest")),
    Setting("job.max_offsets_per_trigger", int, None, "At most this many records a "
            "micro-batch (unset or 0: what the topics hold).", minimum=0),
    Setting("job.identity", bool, True, "Count with record identity. Off (`--no-identity`): "
            "plain per-window counts, no number sets in the state; distinct and duplicates are "
            "reported unknown (null) and no ranges records are written."),
    Setting("job.mirror_target", str, None, "The cluster read is fed by MirrorMaker 2 "
            "(docket-broker mirror) as the target NAME: caught_up marks only as far as its "
            "mirrors vouch (docs/topology.md)."),
    Setting("job.kafka_config", str, None, "A TOML file whose [kafka] table says how to "
            "authenticate (security_protocol, sasl_username, sasl_password_file, ssl_ca_file, "
            "...: docs/security.md); the password is read from its file, never an argument. "
            "Default: the [kafka] table of `--config`'s file, if it has one (not both). In "
            "the file, a relative path is taken from the file's folder."),
    Setting("job.kafka_options", list, [], "Kafka client properties (NAME=VALUE) for the "
            "source and the audit producer, e.g. fetch.max.bytes=52428800; no secret here: "
            "kafka_config."),
    Setting("job.spark_conf", list, [], "Spark configuration properties (NAME=VALUE)."),
)
# Flags whose name is not the key's: a list is given one item a flag.
_FLAG_NAMES = {"job.kafka_options": "--kafka-option", "job.identity": "--no-identity"}
_PATHS = ("checkpoint_dir", "kafka_config")   # relative in the file: from its folder
_METAVARS = {"job.kafka_options": "NAME=VALUE", "job.spark_conf": "NAME=VALUE",
             "job.mirror_target": "NAME", "job.kafka_config": "FILE"}


def _name(s: Setting) -> str:
    return s.key.split(".", 1)[1]


def flag_of(s: Setting) -> str:
    """The command-line flag of setting ``s``."""
    return _FLAG_NAMES.get(s.key, "--" + _name(s).replace("_", "-"))


def add_job_args(p: argparse.ArgumentParser) -> None:
    """Every job setting as a flag (none with a default of its own: what is not given comes
    from ``--config``'s file or the declaration), and ``--config``."""
    p.add_argument("--config", type=Path, default=None, metavar="FILE",
                   help=f"a TOML file whose [{SECTION}] table holds any of these settings by "
                   "their names (docs/jobs-config.md); a flag given wins over it")
    for s in JOB_SETTINGS:
        extra: dict[str, Any] = {"dest": _name(s), "default": argparse.SUPPRESS,
                                 "help": s.help + (" Required." if s.required else "")}
        if s.type is bool:
            extra["action"] = "store_false" if s.default else "store_true"
        elif s.type is list:
            extra.update(action="append", metavar=_METAVARS.get(s.key, "VALUE"))
        else:
            extra["type"] = s.type
            if s.choices:
                extra["choices"] = s.choices
            if s.key in _METAVARS:
                extra["metavar"] = _METAVARS[s.key]
        p.add_argument(flag_of(s), **extra)


def job_values(args: argparse.Namespace) -> tuple[dict[str, Any], KafkaSecurity | None]:
    """The job's settings (key → value, defaults filled in) from ``--config``'s ``[job]``
    table and the flags given, checked; and its sign-in: the ``[kafka]`` table of
    ``kafka_config``'s file, else of ``--config``'s file when it has one, else None. Raises
    ConfigError."""
    raw = load_toml(args.config) if args.config is not None else {}
    table = raw.get(SECTION, {})
    if isinstance(table, dict):
        table = dict(table)
        for key in _PATHS:                       # a path in the file: from the file's folder
            if isinstance(table.get(key), str):
                table[key] = str(Path(args.config).parent / table[key])
        for s in JOB_SETTINGS:
            if hasattr(args, _name(s)):
                table[_name(s)] = getattr(args, _name(s))
    values = parse_sections({**raw, SECTION: table}, JOB_SETTINGS, other_sections=("kafka",))
    _check(values)
    if values["job.kafka_config"] is not None:
        if "kafka" in raw:
            raise ConfigError("kafka", f"a [kafka] table in {args.config} beside kafka_config "
                              f"= {values['job.kafka_config']!r}: which one signs in?",
                              hint="keep one of them")
        return values, read_kafka_config(values["job.kafka_config"],
                                         other_sections=(SECTION,))
    if "kafka" in raw:
        return values, read_kafka_config(args.config, other_sections=(SECTION,))
    return values, None


def _check(values: dict[str, Any]) -> None:
    """What a type and a floor do not say."""
    if not KAFKA_NAME.fullmatch(values["job.audit_topic"]):
        raise ConfigError("job.audit_topic", f"{values['job.audit_topic']!r} is not a Kafka "
                          "topic name", hint="letters, digits, . _ -")
    if not 0 < values["job.trigger_s"] < math.inf:
        raise ConfigError("job.trigger_s", f"must be a number above 0, found "
                          f"{values['job.trigger_s']}")
    try:
        re.compile(values["job.topics"])
    except re.error as exc:
        raise ConfigError("job.topics", f"{values['job.topics']!r} is not a regular "
                          f"expression: {exc}") from None
    for key in ("job.kafka_options", "job.spark_conf"):
        name_values(key, values[key])


def name_values(key: str, items: list[str]) -> dict[str, str]:
    """The ``NAME=VALUE`` items of the list setting ``key`` as a dict; ConfigError naming
    ``key`` for an item without a name or an ``=``."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(key, f"{item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def reference_markdown() -> str:
    """docs/jobs-config.md, generated from the declarations."""
    lines = ["# Spark jobs' settings reference", "",
             "Generated from `audit/jobs/settings.py` by `python -m audit.jobs.settings`; do "
             "not edit by hand.",
             "Every setting of `docket-audit count` and `docket-audit land` is a flag (its "
             "name with dashes: `window_ms` is `--window-ms`; `kafka_options` is "
             "`--kafka-option`, given once per property; `identity` is turned off by "
             "`--no-identity`) and a key of the `[job]` table of `--config FILE`, TOML; a "
             "flag given wins over the file. Unknown keys are errors (exit 78 with the key "
             "path and a hint). `count` adds `--cluster NAME` (its tier), `land` "
             "`--warehouse DIR` and `--dedup`.", ""]
    lines += reference_table(JOB_SETTINGS)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference_markdown())
