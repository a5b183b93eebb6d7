"""``docket-audit``: the audit pipeline's commands.

    docket-audit fetch                      the Spark Kafka connector jars (make setup runs it)
    docket-audit count --cluster NAME --bootstrap-servers HOSTS   the cluster tier (Spark)
    docket-audit land --warehouse DIR --bootstrap-servers HOSTS   the warehouse tier (Spark)
    docket-audit show --db FILE [--topic T] [--since 24h] [--all] the tiers side by side, verdicts
    docket-audit show --bootstrap-servers HOSTS                   the audit topic, newest counts
    docket-audit reconcile --db FILE [--config FILE]              the tiers compared, alerts
    docket-audit watermark --db FILE --topic T --tier TIER        the completeness watermark
    docket-audit validate --config FILE                           check a reconciler config
    docket-audit alerts --db FILE [--snooze ID | --resolve ID]    list, snooze, resolve alerts
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sqlite3
import sys
import time
from importlib.metadata import version
from pathlib import Path

from docket_common.dirs import docket_state_dir
from docket_common.errors import print_error
from docket_common.names import AUDIT_TOPIC, RECONCILE_GROUP
from docket_common.window import DEFAULT_WINDOW_MS, MIN_WINDOW_MS, WINDOW_HELP

from .contract.errors import AuditError, BrokerUnreachable
from .contract.record import checksum_hex
from .reconcile.commands import UNIT_MS
from .reconcile.commands import add_parsers as add_reconcile_parsers

EXIT_USAGE = 64
EXIT_UNAVAILABLE = 69             # sysexits' EX_UNAVAILABLE: the Kafka cluster does not answer
SHOW_CONNECT_TIMEOUT_S = 5.0
DURATION = re.compile(r"(\d+)([smhd])")


def _job_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-servers", required=True, help="the Kafka cluster to read")
    p.add_argument("--audit-topic", default=AUDIT_TOPIC)
    p.add_argument("--audit-bootstrap-servers", default=None,
                   help="where the audit topic lives (default: the cluster read)")
    p.add_argument("--topics", default=".*", help="Java regex of the data topics to read "
                   "(the audit topic and Kafka's internal topics are always left out)")
    p.add_argument("--window-ms", type=int, default=DEFAULT_WINDOW_MS, help=WINDOW_HELP)
    p.add_argument("--trigger-s", type=float, default=60.0,
                   help="seconds between micro-batches (each emits the changed windows)")
    p.add_argument("--once", action="store_true",
                   help="process what the topics hold now, emit, and exit")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="where the job keeps its offsets and state (keep it: it is what makes "
                   "a restart exact)")
    p.add_argument("--master", default="local[*]", help="Spark master (local[*], spark://..., "
                   "yarn, k8s://...)")
    p.add_argument("--starting-offsets", default="earliest", choices=("earliest", "latest"),
                   help="where a job without a checkpoint starts")
    p.add_argument("--max-offsets-per-trigger", type=int, default=None)
    p.add_argument("--no-identity", action="store_true",
                   help="count without record identity: plain per-window counts, no number "
                   "sets in the state; distinct and duplicates are reported unknown (null) "
                   "and no ranges records are written")
    p.add_argument("--mirror-target", default=None, metavar="NAME",
                   help="the cluster read is fed by MirrorMaker 2 (docket-broker mirror) as "
                   "the target NAME: caught_up marks only as far as its mirrors vouch "
                   "(docs/topology.md)")
    p.add_argument("--kafka-config", type=Path, default=None, metavar="FILE",
                   help="a TOML file whose [kafka] table says how to authenticate "
                   "(security_protocol, sasl_username, sasl_password_file, ssl_ca_file, ...: "
                   "docs/security.md); the password is read from its file, never an argument")
    p.add_argument("--kafka-option", action="append", default=[], metavar="NAME=VALUE",
                   help="a Kafka client property for the source and the audit producer "
                   "(repeatable), e.g. fetch.max.bytes=52428800; no secret here: "
                   "--kafka-config")
    p.add_argument("--spark-conf", action="append", default=[], metavar="NAME=VALUE",
                   help="a Spark configuration property (repeatable)")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-audit",
        description="The docket audit pipeline: Spark jobs that count every tier, and the "
        "reconciler that compares them.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    sub = p.add_subparsers(dest="command")
    sub.add_parser("fetch", help="download the Spark Kafka connector jars from Maven Central")
    c = sub.add_parser("count", help="count every record of one Kafka cluster (Spark)")
    c.add_argument("--cluster", required=True, help="the cluster's name: its tier in the audit")
    _job_args(c)
    w = sub.add_parser("land", help="land the data topics as Parquet and count what landed")
    w.add_argument("--warehouse", required=True, type=Path, help="the warehouse folder")
    w.add_argument("--dedup", action="store_true",
                   help="land each record (origin, incarnation, docket-seq) once, even when "
                   "Kafka holds it several times; the audit records say how many copies were "
                   "skipped. A warehouse is landed with or without it, never both")
    _job_args(w)
    s = sub.add_parser("show", help="the tiers side by side per window with a verdict, from "
                       "the reconciler's database (--db); or the newest count of every (tier, "
                       "topic, window, origin) on the audit topic (--bootstrap-servers)")
    source = s.add_mutually_exclusive_group(required=True)
    source.add_argument("--db", type=Path, help="the reconciler's SQLite database: one row per "
                        "topic and window, the tiers side by side, and a verdict (no Kafka)")
    source.add_argument("--bootstrap-servers", help="read the audit topic on this cluster")
    s.add_argument("--audit-topic", default=AUDIT_TOPIC)
    s.add_argument("--kafka-config", type=Path, default=None, metavar="FILE",
                   help="with --bootstrap-servers on a secured cluster: a TOML file whose "
                   "[kafka] table says how to log in (docs/security.md), e.g. the "
                   "reconciler's user; it reads in the reconciler's group, committing nothing")
    s.add_argument("--topic", default=None, help="only this data topic")
    s.add_argument("--since", default=None, metavar="DURATION", help="with --db: the windows "
                   "that started within this long, e.g. 30m, 2h, 7d (default 24h)")
    s.add_argument("--all", action="store_true", help="with --db: also the windows every tier "
                   "counted 0 in (heartbeats only)")
    s.add_argument("--json", action="store_true")
    add_reconcile_parsers(sub)
    return p


def _pairs(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise AuditError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name] = value
    return out


def _kafka_options(items: list[str]) -> dict:
    options = _pairs(items, "--kafka-option")
    for name in options:
        if "password" in name or "jaas" in name or name in ("ssl.key.pem", "ssl.keystore.key"):
            raise AuditError(f"--kafka-option {name}=...: a secret on the command line, where "
                             "ps shows it to every user", hint="put it in --kafka-config FILE "
                             "(sasl_password_file: docs/security.md)")
    return options


def _kafka_security(path: Path | None):
    """The ``[kafka]`` security settings of ``--kafka-config FILE`` (checked), or None."""
    if path is None:
        return None
    from docket_common.kafka_security import read_kafka_config

    return read_kafka_config(path)


def _job_options(args, default_ckpt: Path):
    from .jobs.spark import JobOptions

    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.audit_topic):
        raise AuditError(f"--audit-topic {args.audit_topic!r} is not a Kafka topic name")
    if args.window_ms < MIN_WINDOW_MS:
        raise AuditError(f"--window-ms {args.window_ms} is below {MIN_WINDOW_MS}")
    if args.trigger_s <= 0:
        raise AuditError(f"--trigger-s {args.trigger_s} must be above 0")
    try:
        re.compile(args.topics)
    except re.error as exc:
        raise AuditError(f"--topics {args.topics!r} is not a regular expression: {exc}") from None
    return JobOptions(
        bootstrap_servers=args.bootstrap_servers, audit_topic=args.audit_topic,
        audit_bootstrap_servers=args.audit_bootstrap_servers, topics=args.topics,
        window_ms=args.window_ms, trigger_s=args.trigger_s, once=args.once,
        checkpoint_dir=args.checkpoint_dir or default_ckpt, master=args.master,
        starting_offsets=args.starting_offsets, identity=not args.no_identity,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        kafka_options=_kafka_options(args.kafka_option),
        security=_kafka_security(args.kafka_config),
        spark_conf=_pairs(args.spark_conf, "--spark-conf"), mirror_target=args.mirror_target)


def _duration_ms(text: str, flag: str) -> int:
    m = DURATION.fullmatch(text)
    if not m:
        raise AuditError(f"{flag} {text!r} is not a duration",
                         hint="a number and a unit: 30m, 2h, 7d (s, m, h, d)")
    return int(m.group(1)) * UNIT_MS[m.group(2)]


def _show(args) -> int:
    if args.db is not None:
        return _show_db(args)
    if args.since is not None or args.all:
        raise AuditError("--since and --all select the windows of the reconciler's database",
                         hint="add --db FILE (and leave out --bootstrap-servers)")
    return _show_topic(args)


def _show_db(args) -> int:
    from docket_common.formats import window_label

    from .reconcile.store import Store
    from .reconcile.view import render_json, render_text, window_rows

    since_ms = int(time.time() * 1000) - _duration_ms(args.since or "24h", "--since")
    store = Store(args.db, readonly=True)
    try:
        topics = window_rows(store, since_ms, args.topic, include_empty=args.all)
    except sqlite3.DatabaseError as exc:
        raise AuditError(f"{args.db} is not a reconciler database ({exc})",
                         hint="name the --db of docket-audit reconcile") from None
    finally:
        store.close()
    if args.json:
        print(render_json(topics))
    elif topics:
        print(render_text(topics))
    else:
        what = f"of {args.topic} " if args.topic else ""
        print(f"no windows {what}since {window_label(since_ms)}"
              + ("" if args.all else " with counts (--all shows the empty ones)"))
    return 0


def _show_topic(args) -> int:
    from .contract.collect import librdkafka_log, read_audit_topic

    # librdkafka's lines (one per failed connection) only when asked for
    librdkafka_log.setLevel(logging.DEBUG if args.log_level == "debug" else logging.CRITICAL)
    security = _kafka_security(args.kafka_config)
    conf = {}
    if security is not None and security.secured:    # the reconcile role's group ACL
        conf = {**security.librdkafka_properties(), "group.id": RECONCILE_GROUP}
    state = read_audit_topic(args.bootstrap_servers, args.audit_topic, conf=conf,
                             connect_timeout_s=SHOW_CONNECT_TIMEOUT_S)
    rows = sorted((r for r in state.counts.values() if args.topic in (None, r.topic)),
                  key=lambda r: (r.topic, r.window_start, r.origin, r.tier))
    ranges = sorted(state.ranges.values(), key=lambda r: (r.origin, r.origin_incarnation,
                                                           r.tier, r.emitter))
    if args.json:
        print(json.dumps({"counts": [r.to_dict() for r in rows],
                          "ranges": [r.__dict__ for r in ranges],
                          "progress": [p.__dict__ for p in state.progress.values()],
                          "malformed": dict(state.malformed)}))
        return 0
    print(f"{'topic':24} {'window_start':>14} {'origin':16} {'tier':14} {'count':>10} "
          f"{'distinct':>10} {'dups':>8} {'skipped':>8} {'bytes':>12} checksum          "
          "dropped")
    for r in rows:
        distinct = "?" if r.distinct is None else r.distinct
        dups = "?" if r.duplicates is None else r.duplicates
        skipped = "-" if r.skipped is None else r.skipped      # "-": the tier keeps copies
        print(f"{r.topic:24} {r.window_start:>14} {r.origin:16} {r.tier:14} {r.count:>10} "
              f"{distinct:>10} {dups:>8} {skipped:>8} {r.bytes:>12} {checksum_hex(r.checksum)} "
              f"{r.dropped}")
    for r in ranges:
        shown = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in r.missing[:10])
        more = " ..." if len(r.missing) > 10 or r.missing_truncated else ""
        print(f"ranges {r.origin} (incarnation {r.origin_incarnation}) at {r.tier} "
              f"({r.emitter}): through {r.through}, {r.missing_total} missing"
              + (f": {shown}{more}" if r.missing else ""))
    for p in state.progress.values():
        print(f"progress {p.tier}/{p.emitter}: batch {p.batch_id}, "
              f"{p.processed_rows_per_s:.0f} rows/s, {p.offsets_behind} behind")
    if state.malformed:
        print(f"malformed records skipped: {dict(state.malformed)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.log_level != "debug":     # apscheduler logs every run of every job at INFO
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
    try:
        if args.command == "fetch":
            from .jobs.sparklibs import ensure_spark_kafka_libs

            jars = ensure_spark_kafka_libs(quiet=False)
            print(f"Spark Kafka connector: {len(jars)} jar(s) in {jars[0].parent}")
            return 0
        if args.command == "show":
            return _show(args)
        if args.command in ("reconcile", "watermark", "validate", "alerts"):
            from .reconcile.commands import run as run_reconcile_command

            return run_reconcile_command(args)
        if args.command == "count":
            from .jobs.run import run_count

            if not re.fullmatch(r"[A-Za-z0-9._-]+", args.cluster):
                raise AuditError(f"--cluster {args.cluster!r}: use letters, digits, . _ -")
            opts = _job_options(args, docket_state_dir("audit") / f"count-{args.cluster}")
            run_count(args.cluster, opts)
            return 0
        if args.command == "land":
            from .jobs.run import run_land

            opts = _job_options(args, args.warehouse / "_checkpoint")
            if args.dedup and not opts.identity:
                raise AuditError("--dedup needs record identity; it cannot go with "
                                 "--no-identity")
            run_land(args.warehouse, opts, dedup=args.dedup)
            return 0
    except BrokerUnreachable as exc:
        print_error(exc, "docket-audit")
        return EXIT_UNAVAILABLE
    except AuditError as exc:
        print_error(exc, "docket-audit")
        return EXIT_USAGE if args.command not in ("count", "land", "fetch") else 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:       # a Spark job that stopped: say why in a few lines, exit 1
        if args.command not in ("count", "land"):
            raise
        lines = str(exc).strip().splitlines()
        print(f"docket-audit {args.command}: the job stopped: " + "\n  ".join(lines[:12]),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
