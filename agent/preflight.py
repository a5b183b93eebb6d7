"""What ``validate`` checks beyond the file's form, so that a configuration it passes does not
fail at ``run`` (``ExecStartPre=validate`` must protect the service from a restart loop):

- the producer configuration builds: librdkafka knows every property of
  ``broker.librdkafka_options`` and accepts its value;
- ``agent.state_dir`` is a folder the agent can write, or can be created;
- the pool fits: the disk under ``buffer.path`` has room for the part of the pool file not
  allocated yet.

Each failure is a :class:`ConfigError` naming the key. :func:`pool_geometry` says what the
pool's size rounds to (whole slots and their headers).
"""

from __future__ import annotations

import grp
import logging
import os
from pathlib import Path

from docket_common.kafka_security import without_kinit

from .buffer import layout as L
from .buffer.seams import FileOps
from .config import AgentConfig, ConfigError

_SILENT = logging.getLogger("docket.agent.preflight.librdkafka")
_SILENT.propagate = False
_SILENT.addHandler(logging.NullHandler())


def check(cfg: AgentConfig) -> None:
    check_send_path(cfg)
    check_producer(cfg)
    check_state_dir(cfg.state_dir)
    check_pool_space(cfg)
    check_socket_groups(cfg)


def check_socket_groups(cfg: AgentConfig) -> None:
    """A socket source's group must be one the agent can give its socket: one of its own."""
    mine = {os.getegid(), *os.getgroups()}
    for src in cfg.sources:
        if src.type == "socket" and src.group is not None and os.geteuid() != 0:
            gid = grp.getgrnam(src.group).gr_gid
            if gid not in mine:
                raise ConfigError(f"sources[{src.index}].group",
                                  f"the agent's user (uid {os.geteuid()}) is not in group "
                                  f"{src.group!r}, so it cannot give the socket to it",
                                  hint="add it to the group (usermod -aG GROUP docket) and, "
                                  "under the packaged unit, to SupplementaryGroups= in a "
                                  "drop-in")


def send_path(cfg: AgentConfig) -> tuple[str, str]:
    """The send path the agent would run, and why (``drain.native.choose_send_path``)."""
    from .drain.native import choose_send_path

    return choose_send_path(cfg["broker.send_path"])


def check_send_path(cfg: AgentConfig) -> None:
    """``send_path = "native"`` needs the extension (``auto`` does without it)."""
    from .drain.native import NativeUnavailable, native_module

    if cfg["broker.send_path"] == "native":
        try:
            native_module()
        except NativeUnavailable as exc:
            raise ConfigError("broker.send_path", str(exc),
                              hint="make native; or [broker] send_path = \"auto\" (the Python "
                              "path where the extension is not installed)") from None


def check_producer(cfg: AgentConfig) -> None:
    """The producer settings as the clients of the agent's send path take them: the Python
    client's (every path has one: the audit's producer, resends), and with the native path the
    extension's (the same librdkafka since it links the Python client's, built with the
    native path's own properties)."""
    from confluent_kafka import KafkaException, Producer

    from .drain.native import native_refusal
    from .drain.producer import producer_config

    # Built without the bootstrap servers, so it connects to nothing: the properties are
    # checked when the client is created (ssl.* files included), not when it connects.
    path = send_path(cfg)[0]
    conf = _no_token_request({k: v for k, v in producer_config(cfg, path).items()
                              if k != "bootstrap.servers"})
    ours = set(cfg["broker.librdkafka_options"])
    try:
        producer = Producer(conf, logger=_SILENT)
    except (KafkaException, ValueError, TypeError) as exc:
        text = str(exc.args[0].str() if exc.args and hasattr(exc.args[0], "str") else exc)
        raise _refused(ours, f"librdkafka refuses the producer configuration: {text}",
                       "see librdkafka's CONFIGURATION.md for the property names and "
                       "values") from None
    del producer
    text = native_refusal(conf) if path == "native" else None
    if text is not None:
        raise _refused(ours, f"the native send path's librdkafka refuses the producer "
                       f"configuration: {text}", "remove the property, or set [broker] "
                       "send_path = \"python\" to send with the Python client, which takes it")


def _no_token_request(conf: dict) -> dict:
    """``conf`` fit to be checked without asking a token endpoint: a client made with
    OAUTHBEARER's OIDC method asks for its token at once, and one whose endpoint does not
    answer takes librdkafka 20 s to destroy — twice at every start and reload. Its OAUTHBEARER
    keys are checked by their settings (``KafkaSecurity.check_form``); here a SASL login that
    asks nobody stands in for them. With GSSAPI, a client runs ``kinit`` when it is made,
    asking the KDC (seconds when it does not answer): the check's client runs none."""
    if conf.get("sasl.mechanism") == "GSSAPI":
        return without_kinit(conf)
    if conf.get("sasl.mechanism") != "OAUTHBEARER":
        return conf
    out = {k: v for k, v in conf.items() if not k.startswith("sasl.")}
    out.update({"sasl.mechanism": "PLAIN", "sasl.username": "-", "sasl.password": "-"})
    return out


def _refused(ours: set[str], problem: str, hint: str) -> ConfigError:
    """A refused producer configuration, at the option of ours that librdkafka's text names."""
    key = next((k for k in sorted(ours, key=len, reverse=True) if f'"{k}"' in problem
                or f" {k}" in problem), None)
    where = f"broker.librdkafka_options.{key}" if key else "broker.librdkafka_options"
    return ConfigError(where, problem, hint=hint)


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that can be looked at."""
    path = path.absolute()
    while path != path.parent:
        try:
            os.stat(path)
            return path
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            path = path.parent
    return path


def check_state_dir(state: Path) -> None:
    base = _nearest_existing(state)
    if not base.is_dir():
        raise ConfigError("agent.state_dir", f"{state} cannot be created: {base} is not a folder",
                          hint="choose a folder on a local disk, e.g. /var/lib/docket")
    if not os.access(base, os.W_OK | os.X_OK):
        what = "is not writable" if base == state.absolute() else \
            f"cannot be created: {base} is not writable"
        raise ConfigError("agent.state_dir", f"{state} {what} by this user (uid {os.getuid()})",
                          hint="run the agent as the folder's owner (the package's unit runs it "
                          "as docket with StateDirectory=docket), or choose another folder")


def check_pool_space(cfg: AgentConfig) -> None:
    path = cfg.buffer_path
    geometry = pool_geometry(cfg)
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is not None and st.st_size >= geometry.file_bytes:
        return        # the pool exists at its size (perhaps sparse where fallocate is not had)
    allocated = st.st_blocks * 512 if st is not None else 0
    need = max(0, geometry.file_bytes - allocated)
    folder = _nearest_existing(path.parent)
    try:
        free = FileOps().free_bytes(folder)          # what the pool itself checks at creation
    except OSError as exc:
        raise ConfigError("buffer.path", f"cannot look at {folder}: {exc.strerror}") from None
    if need > free:
        raise ConfigError("buffer.size_bytes",
                          f"the pool file needs {need:,} more bytes, the file system of "
                          f"{folder} has {free:,} free",
                          hint="lower buffer.size_bytes or put buffer.path on a larger disk")
    state = _nearest_existing(cfg.state_dir)
    left = FileOps().free_bytes(state) - (need if os.stat(state).st_dev ==
                                          os.stat(folder).st_dev else 0)
    if left < cfg["agent.disk_reserve_bytes"]:
        cfg.warnings.append((
            "agent.disk_reserve_bytes",
            f"the state folder's file system would have {left:,} bytes free with the pool, "
            f"below the reserve of {cfg['agent.disk_reserve_bytes']:,}: the agent would not "
            "read until space is freed (lower the reserve or free space)"))


def pool_geometry(cfg: AgentConfig) -> L.Geometry:
    return L.Geometry.fit(cfg["buffer.size_bytes"], cfg["buffer.slot_size_bytes"])


def describe_pool(cfg: AgentConfig) -> str:
    g = pool_geometry(cfg)
    return (f"pool {g.slot_count} slots of {g.slot_bytes:,} bytes: a file of {g.file_bytes:,} "
            f"bytes (buffer.size_bytes {cfg['buffer.size_bytes']:,})")
