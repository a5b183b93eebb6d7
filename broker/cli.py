"""``docket-broker``: run a real local Apache Kafka and manage docket's topics on it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from importlib.metadata import version
from pathlib import Path

from confluent_kafka import KafkaException

from docket_common.errors import DocketError, print_error
from docket_common.kafka_security import read_kafka_config
from docket_common.names import AUDIT_TOPIC

from .admin import AUDIT_TOPIC_CONFIG, TopicSpec, admin_client, ensure_topics, list_topics
from .cluster import LocalCluster, clusters_dir, default_data_dir, named_clusters
from .errors import BrokerError
from .libs import KAFKA_VERSION, ensure_kafka_libs
from .mirror import Mirror, MirrorSpec, mirrors, mirrors_dir
from .security import (
    ADMIN,
    MODES,
    PLAINTEXT,
    ROLES,
    SASL_SSL,
    USERS,
    Scope,
    grant,
    kafka_acls_lines,
    list_acls,
    revoke,
    role_acls,
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="docket-broker",
        description=f"A local Apache Kafka {KAFKA_VERSION} (KRaft) on 127.0.0.1 for development, "
        "the demo and the tests, and docket's topic administration.",
    )
    p.add_argument("--version", action="version",
                   version=f"%(prog)s {version('docket')} (Apache Kafka {KAFKA_VERSION})")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--data-dir", default=None,
                       help=f"cluster state, data and logs (default: $DOCKET_BROKER_DIR or "
                       f"{default_data_dir()})")
    where.add_argument("--name", dest="cluster_name", default=None,
                       help="a named cluster (several run side by side, e.g. local and "
                       f"aggregate), kept in {clusters_dir()}/NAME")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start the cluster and wait until it answers metadata")
    up.add_argument("--brokers", type=int, choices=(1, 3), default=1)
    up.add_argument("--base-port", type=int, default=None,
                    help="first client port (default 9092, or the ports of the existing data "
                    "dir); 0 picks free ports")
    up.add_argument("--fresh", action="store_true", help="wipe the data dir before starting")
    up.add_argument("--timeout-s", type=float, default=120.0, help="how long to wait for readiness")
    up.add_argument("--security", choices=MODES, default=None,
                    help="plaintext (default for a new cluster), sasl_ssl (SCRAM-SHA-512 over "
                    "TLS) or mtls (TLS with client certificates); both secured modes enforce "
                    "ACLs. Kept with the cluster: a restart keeps its mode (docs/security.md)")

    down = sub.add_parser("down", help="stop the brokers this data dir started (safe to repeat)")
    down.add_argument("--timeout-s", type=float, default=30.0,
                      help="grace period before SIGKILL")

    st = sub.add_parser("status", help="each broker's pid, port and state")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sub.add_parser("list", help="the named clusters, their bootstrap servers and state")

    sub.add_parser("fetch", help="download the Kafka jars from Maven Central (make setup runs it)")

    settings = sub.add_parser("settings", help="the client settings of a user of the cluster "
                              "(a secured cluster's credentials: files, never the password)")
    settings.add_argument("--user", choices=USERS, default="agent")
    form = settings.add_mutually_exclusive_group()
    form.add_argument("--java", action="store_true",
                      help="Java client properties (MirrorMaker 2, Spark's kafka. options, "
                      "kafka-acls --command-config) instead of librdkafka's")
    form.add_argument("--toml", action="store_true",
                      help="docket's own settings (the agent's [broker], the reconciler's "
                      "[reconcile], the Spark jobs' --kafka-config [kafka])")

    acl = sub.add_parser("acl", help="the least-privilege ACLs of docket's roles on a secured "
                         "cluster (docs/security.md)")
    asub = acl.add_subparsers(dest="acl_command", required=True, metavar="ACTION")
    agrant = asub.add_parser("grant", help="create a role's ACLs (as the admin user)")
    arevoke = asub.add_parser("revoke", help="delete exactly the ACLs grant creates")
    for a in (agrant, arevoke):
        a.add_argument("--role", required=True, choices=ROLES)
        a.add_argument("--principal", help="default: User:ROLE, the cluster's user of the role")
        a.add_argument("--topic", action="append", default=[], metavar="NAME",
                       help="a data topic of the role (literal ACL), repeatable")
        a.add_argument("--topic-prefix", action="append", default=[], metavar="PREFIX",
                       help="data topics by prefix (prefixed ACL), e.g. app. ; repeatable. A "
                       "regular expression cannot be an ACL")
        a.add_argument("--audit-topic", default=AUDIT_TOPIC,
                       help=f"default {AUDIT_TOPIC}; '' for none")
        a.add_argument("--group", action="append", default=None, metavar="NAME",
                       help="a consumer group of the role (Read), repeatable; replaces the "
                       "role's default (the reconciler's: docket-reconcile)")
        a.add_argument("--group-prefix", action="append", default=[], metavar="PREFIX",
                       help="consumer groups by prefix (Read), e.g. spark-kafka-source for "
                       "Spark's consumer-based offset fetching; repeatable")
        a.add_argument("--flow", metavar="SOURCE->TARGET",
                       help="mirror: the flow, by the clusters' names (MirrorMaker 2's aliases)")
        a.add_argument("--side", choices=("source", "target"),
                       help="mirror: which end of the flow this cluster is (default: the one "
                       "--name names)")
        a.add_argument("--legacy-brokers", action="store_true",
                       help="also IdempotentWrite on the cluster, which brokers before Kafka "
                       "3.0 require of idempotent producers")
        a.add_argument("--exactly-once", action="store_true",
                       help="agent: also what broker.delivery = \"exactly_once\" needs "
                       "(transactional ids and groups docket-agent-*, Read on the progress "
                       "topic)")
        a.add_argument("--progress-topic", default="docket.progress",
                       help="agent, --exactly-once: the progress topic (default "
                       "docket.progress)")
        a.add_argument("--print", dest="print_only", action="store_true",
                       help="print the equivalent kafka-acls lines instead (any cluster)")
    alist = asub.add_parser("list", help="the ACLs on the cluster")
    alist.add_argument("--principal", help="only this principal's, e.g. User:agent")

    mirror = sub.add_parser("mirror", help="MirrorMaker 2 copying topics between two clusters")
    msub = mirror.add_subparsers(dest="mirror_command", required=True, metavar="ACTION")
    mup = msub.add_parser("up", help="start copying topics from --source to --target")
    mdown = msub.add_parser("down", help="stop a mirror (safe to repeat)")
    for m in (mup, mdown):
        m.add_argument("--source", required=True, help="the cluster copied from (its name)")
        m.add_argument("--target", required=True, help="the cluster copied to (its name)")
    mup.add_argument("--topics", required=True, metavar="REGEX",
                     help="the topics copied, a regular expression, e.g. 'app\\..*'")
    mup.add_argument("--audit-topic", default=AUDIT_TOPIC,
                     help=f"copied too, created on the target first (default {AUDIT_TOPIC}); "
                     "'' copies no audit topic")
    mup.add_argument("--source-bootstrap", help="default: the named cluster --source")
    mup.add_argument("--target-bootstrap", help="default: the named cluster --target")
    for side in ("source", "target"):
        mup.add_argument(f"--{side}-kafka-config", type=Path, metavar="FILE",
                         help=f"how the mirror reaches --{side}-bootstrap: a TOML file's "
                         "[kafka] table (docs/security.md); a named secured cluster's own "
                         "mirror user by default")
    mup.add_argument("--refresh-s", type=int, default=5,
                     help="how soon a new topic matching --topics is copied (default 5)")
    mup.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                     help="a MirrorMaker 2 property set over docket's, repeatable")
    mup.add_argument("--timeout-s", type=float, default=120.0,
                     help="how long to wait for it to join the target")
    mst = msub.add_parser("status", help="every mirror, its topics and state")
    mst.add_argument("--json", action="store_true", help="print JSON instead of a table")

    topic = sub.add_parser("topic", help="create or list topics")
    tsub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    ens = tsub.add_parser("ensure", help="create a topic unless it exists with these settings")
    ens.add_argument("name")
    ens.add_argument("--partitions", type=int, default=3)
    ens.add_argument("--replication-factor", type=int, default=-1,
                     help="default: the cluster's default.replication.factor")
    ens.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                     help="topic config, repeatable")
    ens.add_argument("--audit", action="store_true",
                     help="apply the audit topic's retention settings")
    ens.add_argument("--bootstrap-servers", help="default: the local cluster of --data-dir")
    ls = tsub.add_parser("list", help="topics with partitions and replication factor")
    ls.add_argument("--bootstrap-servers", help="default: the local cluster of --data-dir")
    return p


def _bootstrap(args, cluster: LocalCluster) -> tuple[str, dict | None]:
    """The bootstrap servers ``topic`` works on, and the admin's client settings when they
    are the local cluster's and it is secured."""
    if args.bootstrap_servers:
        return args.bootstrap_servers, None
    layout = _running_layout(cluster)
    if layout.security == PLAINTEXT:
        return layout.bootstrap_servers, None
    return layout.bootstrap_servers, cluster.client_settings(ADMIN)


def _running_layout(cluster: LocalCluster):
    layout = cluster.layout()
    if layout is None or not cluster.running_nodes():
        raise BrokerError(f"no local cluster is running from {cluster.data_dir}",
                          hint="start one with `docket-broker up`, or pass --bootstrap-servers")
    return layout


def _config_pairs(pairs: list[str], option: str = "--config",
                  example: str = "retention.ms=86400000") -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise BrokerError(f"{option} {pair!r} is not KEY=VALUE",
                              hint=f"for example {option} {example}")
        out[key] = value
    return out


@dataclasses.dataclass(frozen=True)
class _End:
    """One end of a mirror: its bootstrap servers, how the mirror reaches it (a ``[kafka]``
    table), and the admin's librdkafka settings when docket knows them (a named cluster)."""
    bootstrap: str
    security: dict[str, str]
    admin: dict[str, str] | None


def _mirror_end(args, side: str) -> _End:
    bootstrap = getattr(args, f"{side}_bootstrap")
    config = getattr(args, f"{side}_kafka_config")
    if bootstrap:
        table = read_kafka_config(config).table() if config else {}
        return _End(bootstrap, table, None)
    if config:
        raise BrokerError(f"--{side}-kafka-config goes with --{side}-bootstrap",
                          hint=f"a named cluster's mirror user is known: drop --{side}-"
                          "kafka-config, or name the cluster by its bootstrap servers")
    name = getattr(args, side)
    cluster = LocalCluster(default_data_dir(name))
    layout = cluster.layout()
    if layout is None or not cluster.running_nodes():
        raise BrokerError(f"no cluster named {name!r} is running",
                          hint=f"start it with `docket-broker --name {name} up`, or pass its "
                          "bootstrap servers")
    if layout.security == PLAINTEXT:
        return _End(layout.bootstrap_servers, {}, None)
    security = cluster.security(layout)
    return _End(layout.bootstrap_servers, security.docket_settings("mirror"),
                cluster.client_settings(ADMIN))


def run_mirror(args) -> int:
    mirror = Mirror.named(args.source, args.target) if args.mirror_command != "status" else None
    if args.mirror_command == "up":
        source, target = _mirror_end(args, "source"), _mirror_end(args, "target")
        spec = MirrorSpec(args.source, args.target, source.bootstrap, target.bootstrap,
                          args.topics, audit_topic=args.audit_topic or None,
                          refresh_s=args.refresh_s,
                          properties=_config_pairs(args.property, "--property", "tasks.max=2"),
                          source_security=source.security, target_security=target.security)
        conf = spec.client_conf("target")
        brokers = len(admin_client(conf.pop("bootstrap.servers"), conf)
                      .list_topics(timeout=10).brokers)
        spec = dataclasses.replace(spec, replication_factor=3 if brokers >= 3 else 1)
        mirror.up(spec, timeout_s=args.timeout_s, admin=target.admin)
        print(f"mirroring '{spec.pattern}' from {args.source} ({source.bootstrap}, "
              f"{spec.security('source').describe()}) to {args.target} ({target.bootstrap}, "
              f"{spec.security('target').describe()}); log in {mirror.log_file}")
    elif args.mirror_command == "down":
        pid = mirror.down()
        print(f"stopped the mirror {args.source} -> {args.target}" if pid
              else f"no mirror {args.source} -> {args.target} is running")
    else:
        rows = [st for m in mirrors() if (st := m.status()) is not None]
        if args.json:
            print(json.dumps({"mirrors": rows}, indent=2))
        elif not rows:
            print(f"no mirror in {mirrors_dir()}")
        for r in [] if args.json else rows:
            print(f"{r['source']} -> {r['target']}\t{r['state']}\tpid={r['pid'] or '-'}"
                  f"\twatcher={r['watch_state']}\ttopics={r['topics']}")
        return 0 if rows and all(r["state"] != "stopped" for r in rows) else 3
    return 0


def print_security(cluster: LocalCluster, user: str = "agent") -> None:
    """What a client needs to reach a secured cluster: where the credentials are, and one
    user's settings (never a password: its file)."""
    layout = cluster.layout()
    security = cluster.security(layout)
    if not security.secured:
        return
    users = security.users_dir
    how = ("SCRAM-SHA-512 over TLS" if layout.security == SASL_SSL
           else "TLS with client certificates")
    print(f"security: {layout.security} ({how}), ACLs enforced, super user {ADMIN}")
    print(f"  CA certificate: {security.ca_file}")
    if layout.security == SASL_SSL:
        print(f"  users {', '.join(USERS)}: passwords in {users}/USER.password (0600)")
    else:
        print(f"  users {', '.join(USERS)}: certificates {users}/USER.crt, keys "
              f"{users}/USER.key (0600)")
    print(f"  client settings (librdkafka) of the user {user}; `docket-broker settings "
          "--user USER [--java]` prints any user's:")
    for key, value in security.client_recipe(layout.bootstrap_servers, user).items():
        print(f"    {key}={value}")
    print("  grant each role its ACLs with `docket-broker acl grant --role ROLE ...`")


def run_acl(args, cluster: LocalCluster) -> int:
    name = getattr(args, "cluster_name", None)
    if args.acl_command == "list":
        layout = _secured_layout(cluster)
        admin = admin_client(layout.bootstrap_servers, cluster.client_settings(ADMIN))
        for a in list_acls(admin, args.principal):
            print(a.describe())
        return 0
    source = target = None
    if args.flow:
        source, sep, target = args.flow.partition("->")
        if not sep or not source or not target:
            raise BrokerError(f"--flow {args.flow!r} is not SOURCE->TARGET",
                              hint="e.g. --flow 'local->aggregate'")
    side = args.side or ("source" if name and name == source else
                         "target" if name and name == target else None)
    scope = Scope(topics=tuple(args.topic), topic_prefixes=tuple(args.topic_prefix),
                  audit_topic=args.audit_topic or None,
                  groups=None if args.group is None else tuple(args.group),
                  group_prefixes=tuple(args.group_prefix), mirror_source=source,
                  mirror_target=target, side=side, legacy_brokers=args.legacy_brokers,
                  progress_topic=args.progress_topic if args.exactly_once else None)
    acls = role_acls(args.role, args.principal or f"User:{args.role}", scope)
    action = "--add" if args.acl_command == "grant" else "--remove"
    if args.print_only:
        layout = cluster.layout()
        bootstrap = layout.bootstrap_servers if layout else "BOOTSTRAP"
        for line in kafka_acls_lines(acls, bootstrap, "admin.properties", action):
            print(line)
        return 0
    layout = _secured_layout(cluster)
    admin = admin_client(layout.bootstrap_servers, cluster.client_settings(ADMIN))
    if args.acl_command == "grant":
        grant(admin, acls)
        verb = "granted"
    else:
        revoke(admin, acls)
        verb = "revoked"
    for a in acls:
        print(f"{verb}: {a.describe()}")
    return 0


def _secured_layout(cluster: LocalCluster):
    layout = _running_layout(cluster)
    if layout.security == PLAINTEXT:
        raise BrokerError(f"the cluster in {cluster.data_dir} is plaintext: it has no "
                          "authorizer, so no ACLs",
                          hint="start a secured one with `docket-broker up --fresh --security "
                          "sasl_ssl` (or mtls); `acl grant --print` prints kafka-acls lines "
                          "for any cluster")
    return layout


def run(args) -> int:
    if args.command == "mirror":
        return run_mirror(args)
    if args.command == "list":
        clusters = named_clusters()
        if not clusters:
            print(f"no named cluster in {clusters_dir()}")
        for name, cluster in clusters.items():
            layout = cluster.layout()
            running = len(cluster.running_nodes())
            print(f"{name}\t{layout.bootstrap_servers}\t{running}/{len(layout.nodes)} "
                  f"broker(s) running\t{cluster.data_dir}")
        return 0
    cluster = LocalCluster(default_data_dir(args.cluster_name) if args.cluster_name
                           else args.data_dir)
    if args.command == "up":
        layout = cluster.up(brokers=args.brokers, base_port=args.base_port, fresh=args.fresh,
                            timeout_s=args.timeout_s, security=args.security)
        print(f"{len(layout.nodes)} broker(s) of Apache Kafka {layout.kafka_version} up; "
              f"data and logs in {cluster.data_dir}")
        print_security(cluster)
        print(f"bootstrap_servers={layout.bootstrap_servers}")
    elif args.command == "settings":
        layout = cluster.layout()
        if layout is None:
            raise BrokerError(f"no cluster in {cluster.data_dir}",
                              hint="start one with `docket-broker up`")
        security = cluster.security(layout)
        if args.toml:
            print(f"# bootstrap servers {layout.bootstrap_servers}; under [broker] (agent), "
                  "[reconcile] (reconciler) or [kafka] (--kafka-config of the Spark jobs)")
            for key, value in security.docket_settings(args.user).items():
                print(f'{key} = "{value}"')
            return 0
        if args.java:
            settings = {"bootstrap.servers": layout.bootstrap_servers,
                        **security.java_client_properties(args.user)}
        else:
            settings = security.client_recipe(layout.bootstrap_servers, args.user)
        for key, value in settings.items():
            print(f"{key}={value}")
    elif args.command == "acl":
        return run_acl(args, cluster)
    elif args.command == "down":
        pids = cluster.down(timeout_s=args.timeout_s)
        print(f"stopped {len(pids)} broker(s)" if pids
              else f"no broker running from {cluster.data_dir}")
    elif args.command == "status":
        rows = cluster.status()
        if args.json:
            layout = cluster.layout()
            print(json.dumps({"data_dir": str(cluster.data_dir),
                              "security": layout.security if layout else None,
                              "brokers": rows}, indent=2))
        elif not rows:
            print(f"no cluster in {cluster.data_dir}")
        else:
            print(f"{'node':>4}  {'pid':>8}  {'port':>5}  {'ctrl':>5}  state")
            for r in rows:
                print(f"{r['node_id']:>4}  {r['pid'] or '-':>8}  {r['port']:>5}  "
                      f"{r['controller_port']:>5}  {r['state']}")
        return 0 if rows and all(r["state"] == "running" for r in rows) else 3
    elif args.command == "fetch":
        print(f"Apache Kafka {KAFKA_VERSION} jars in {ensure_kafka_libs()}")
    elif args.command == "topic":
        bootstrap, admin = _bootstrap(args, cluster)
        if args.topic_command == "ensure":
            config = {**(AUDIT_TOPIC_CONFIG if args.audit else {}), **_config_pairs(args.config)}
            spec = TopicSpec(args.name, args.partitions, args.replication_factor, config)
            created = ensure_topics(bootstrap, [spec], client=admin)
            print(f"{'created' if created else 'exists'}: {args.name}")
        else:
            for name, (partitions, replicas) in list_topics(bootstrap, client=admin).items():
                print(f"{name}\tpartitions={partitions}\treplication_factor={replicas}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except DocketError as exc:          # BrokerError, and ConfigError of a --*-kafka-config
        print_error(exc, "docket-broker: error")
        return 1
    except KafkaException as exc:
        print(f"docket-broker: error: Kafka request failed: {exc.args[0].str()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
