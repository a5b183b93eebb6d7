"""``docket-audit``: the audit pipeline's commands.

    docket-audit fetch                      the Spark Kafka connector jars, the audit jobs' Java
                                            (make setup runs it)
    docket-audit count --cluster NAME --bootstrap-servers HOSTS   the cluster tier (Spark)
    docket-audit land --warehouse DIR --bootstrap-servers HOSTS   the warehouse tier (Spark)
      (either with --config FILE: its [job] table, docs/jobs-config.md)
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
from docket_common.kafka_security import read_kafka_config
from docket_common.names import AUDIT_TOPIC, RECONCILE_GROUP
from docket_common.settings import EX_CONFIG, ConfigError

from .contract.errors import AuditError, BrokerUnreachable
from .contract.record import checksum_hex
from .jobs.settings import KAFKA_NAME, add_job_args, job_values, name_values
from .reconcile.commands import UNIT_MS
from .reconcile.commands import add_parsers as add_reconcile_parsers

EXIT_USAGE = 64
EXIT_UNAVAILABLE = 69             # sysexits' EX_UNAVAILABLE: the Kafka cluster does not answer
SHOW_CONNECT_TIMEOUT_S = 5.0
DURATION = re.compile(r"(\d+)([smhd])")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-audit",
        description="The docket audit pipeline: Spark jobs that count every tier, and the "
        "reconciler that compares them.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version('docket')}")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    sub = p.add_subparsers(dest="command")
    sub.add_parser("fetch", help="download the Spark Kafka connector jars from Maven Central "
                   "and build the audit jobs' Java")
    c = sub.add_parser("count", help="count every record of one Kafka cluster (Spark)")
    c.add_argument("--cluster", required=True, help="the cluster's name: its tier in the audit")
    add_job_args(c)
    w = sub.add_parser("land", help="land the data topics as Parquet and count what landed")
    w.add_argument("--warehouse", required=True, type=Path, help="the warehouse folder")
    w.add_argument("--dedup", action="store_true",
                   help="land each record (origin, incarnation, docket-seq) once, even when "
                   "Kafka holds it several times; the audit records say how many copies were "
                   "skipped. A warehouse is landed with or without it, never both")
    add_job_args(w)
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


def _kafka_options(items: list[str]) -> dict:
    options = name_values("job.kafka_options", items)
    for name in options:
        if "password" in name or "jaas" in name or name in ("ssl.key.pem", "ssl.keystore.key"):
            raise AuditError(f"--kafka-option (kafka_options) {name}=...: a secret among the "
                             "client options, where ps shows it to every user (a flag) or "
                             "anyone who reads the job's file", hint="put it in the [kafka] "
                             "table's files (sasl_password_file: docs/security.md)")
    return options


def _job_options(args, default_ckpt: Path):
    """The job's settings (``audit/jobs/settings.py``: flags over ``--config``'s file)."""
    from .jobs.spark import JobOptions

    values, security = job_values(args)
    v = {key.split(".", 1)[1]: value for key, value in values.items()}
    return JobOptions(
        bootstrap_servers=v["bootstrap_servers"], audit_topic=v["audit_topic"],
        audit_bootstrap_servers=v["audit_bootstrap_servers"], topics=v["topics"],
        window_ms=v["window_ms"], trigger_s=v["trigger_s"], once=v["once"],
        checkpoint_dir=Path(v["checkpoint_dir"]) if v["checkpoint_dir"] is not None
        else default_ckpt,
        master=v["master"], starting_offsets=v["starting_offsets"], identity=v["identity"],
        max_offsets_per_trigger=v["max_offsets_per_trigger"],
        kafka_options=_kafka_options(v["kafka_options"]),
        security=security,
        spark_conf=name_values("job.spark_conf", v["spark_conf"]), mirror_target=v["mirror_target"])


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
    security = read_kafka_config(args.kafka_config) if args.kafka_config else None
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
            from .jobs.jvm import ensure_jar
            from .jobs.sparklibs import ensure_spark_kafka_libs

            jars = ensure_spark_kafka_libs(quiet=False)
            print(f"Spark Kafka connector: {len(jars)} jar(s) in {jars[0].parent}")
            print(f"the audit jobs' Java: {ensure_jar(required=True)}")
            return 0
        if args.command == "show":
            return _show(args)
        if args.command in ("reconcile", "watermark", "validate", "alerts"):
            from .reconcile.commands import run as run_reconcile_command

            return run_reconcile_command(args)
        if args.command == "count":
            from .jobs.run import run_count

            if not KAFKA_NAME.fullmatch(args.cluster):
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
    except ConfigError as exc:
        print_error(exc)
        return EX_CONFIG
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
