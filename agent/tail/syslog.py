"""The syslog source: RFC 5424 and RFC 3164 messages over TCP (optionally TLS) or UDP.

Each message is one record: as received (``format = "raw"``), or its fields as one JSON object
(``format = "json"``, the default: ``facility``, ``severity``, ``timestamp``, ``host``, ``app``,
``procid``, ``msgid``, ``structured_data``, ``message``, ``protocol``, and ``peer``, the
sender's address). A message neither standard parses is shipped whole under ``message`` with
``parse_error`` saying why, and counted (``agent_source_bad_input_total{kind=
"syslog_unparsable"}``): never dropped. Where the native extension is installed, it makes the
JSON objects of a batch in one call (``docket_native.SyslogJson``: the same bytes; what it does
not take on is left to the Python parse here).

**TCP** (RFC 6587, both framings, each frame on its own: ``syslog_format.Frames``): every
connection is read by its own thread; while the pool is full that thread waits before reading
more, so the kernel's buffers fill and the sender's writes block (backpressure, as the socket
source). A frame a sender left unended when it closed is sent, counted as
``partial_line_flushed``. With ``ssl_certificate_file`` and ``ssl_key_file`` the listener
speaks TLS; with ``ssl_ca_file`` too it asks every client for a certificate signed by that CA.

**UDP** cannot wait: a datagram that finds the socket's receive buffer full is dropped by the
kernel. The kernel counts those drops per socket and hands the count over with each datagram
(``SO_RXQ_OVFL``), so the source knows exactly how many it lost: counted at once in
``agent_source_udp_dropped_total``, and journalled as one entry a minute with the total
(``reason = "udp_dropped"``; the journal counts it in ``agent_dropped_events_total`` and the
audit's ``dropped`` of the window then), and at the source's close. The count of drops comes with
the next datagram that finds room: drops after the last one are known when another arrives.

Records are in the pool once appended; like the socket source's, what a filling slot holds when
the agent is killed is lost (it seals after ``linger_ms``, later when the loop is held up):
syslog senders cannot be asked again. A stop reads what the kernel still holds first.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import ssl
import struct
import threading
import time
from datetime import datetime

from docket_common.kafka_security import read_secret
from docket_common.settings import ConfigError

from ..buffer import BufferPool, Chunk
from ..buffer.framing import MAX_KEY_BYTES
from ..buffer.seams import Clock
from ..config import SourceConfig, split_listen
from ..errors import StartupError
from ..routing import Template
from ..state.journal import LossJournal
from ..telemetry import Metrics
from .events import apply_fields
from .lines import MAX_LINE_BYTES
from .sock import PoolFeed, accept_each, left_in, reads
from .syslog_format import FACILITIES, SEVERITIES, Frames, Unparsable, parse, strip_frame

log = logging.getLogger("docket.agent.syslog")
DATAGRAM_BYTES = 65_535
BATCH_DATAGRAMS = 1_000                 # read at most this many before appending them
SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)     # Linux's number; Python 3.11 lacks the name
JOURNAL_EVERY_S = 60.0                  # UDP drops: one journal entry per minute with the total
# The fields of the JSON form before the added ones (``add_fields`` naming one of them leaves
# the form to Python, where the added value takes that field's place)
NATIVE_FIELDS = frozenset(("facility", "severity", "timestamp", "host", "app", "procid",
                           "msgid", "structured_data", "message", "protocol", "peer"))


class SyslogSource:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, metrics: Metrics,
                 journal: LossJournal, clock: Clock | None = None, on_data=None):
        self.cfg = cfg
        self.clock = clock or Clock()
        self.metrics = metrics
        self.journal = journal
        self._stop = threading.Event()
        self.label = cfg.fallback_topic or cfg.topic    # a routed source's counts go here
        self.feed = PoolFeed(self.label, pool, metrics, on_data or (lambda: None), self._stop,
                             journal)
        self._threads: list[threading.Thread] = []
        self._drops_seen = 0            # the kernel's count of this socket's dropped datagrams
        self._drops_unjournalled = 0
        routed = Template(cfg.topic)
        self._topic = None if routed.is_static else routed      # topic = "syslog.{app}"
        self._key = Template(cfg.key) if cfg.key is not None else None
        self._native = self._native_json()
        self._peer_json: dict[str, str] = {}
        self._tls = _tls_context(cfg) if cfg.protocol == "tcp" else None
        self.sock = _listen(cfg)
        target = self._accept_loop if cfg.protocol == "tcp" else self._receive_loop
        self._main = threading.Thread(target=target, name=f"docket-syslog-{cfg.protocol}",
                                      daemon=True)
        self._main.start()
        log.info("syslog source %d: listening on %s %s%s, topic %s", cfg.index, cfg.protocol,
                 cfg.listen, " (TLS)" if self._tls else "", cfg.topic)

    # -- records ---------------------------------------------------------------------------
    def _deliver(self, frames: list[bytes], peers: list[str] | str) -> None:
        """Append ``frames`` (one message each; ``peers``: the sender of each, or of all)."""
        messages = [strip_frame(f) for f in frames]
        senders = [peers] * len(messages) if isinstance(peers, str) else peers
        if not all(messages):
            kept = [(m, p) for m, p in zip(messages, senders, strict=True) if m]
            self._bad("empty_line", len(messages) - len(kept))
            if not kept:
                return
            messages, senders = [m for m, _ in kept], [p for _, p in kept]
        read_ms = self.clock.time_ms()
        nbytes = sum(map(len, frames))
        if self.cfg.format == "raw":
            self._append(self.cfg.topic, messages, None, read_ms, nbytes)
            return
        now = datetime.fromtimestamp(read_ms / 1000).astimezone()   # once a batch
        offset_s = now.utcoffset().total_seconds()
        if self._native is not None and offset_s % 60 == 0:
            self._append(self.cfg.topic, self._natively(messages, peers, senders, read_ms,
                                                        int(offset_s), now),
                         None, read_ms, nbytes)
            return
        by_topic: dict[str, tuple[list[bytes], list[bytes | None]]] = {}
        for m, p in zip(messages, senders, strict=True):
            fields = self._fields(m, p, now)
            topic = self.cfg.topic
            if self._topic is not None:
                topic = self._topic.topic(fields)
                if topic is None:
                    self._bad("routed_to_fallback")
                    topic = self.cfg.fallback_topic
            key = None
            if self._key is not None:
                rendered = self._key.render(fields)
                if rendered is None:
                    self._bad("key_template_unmatched")
                else:
                    key = rendered.encode()[:MAX_KEY_BYTES]
            records, keys = by_topic.setdefault(topic, ([], []))
            records.append(json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
                           .encode())
            keys.append(key)
        for topic, (records, keys) in by_topic.items():
            self._append(topic, records, keys if self._key is not None else None, read_ms,
                         nbytes * len(records) // len(messages))

    def _native_json(self):
        """The native extension's maker of this source's JSON objects (``SyslogJson``: the same
        bytes as ``_fields`` and ``json.dumps``, for the messages it takes on), or None: the
        extension not built (or older), ``format = "raw"``, a topic or key template (they read
        the fields), or an added field named as a parsed one (its place would differ)."""
        if self.cfg.format != "json" or self._topic is not None or self._key is not None:
            return None
        added = self.cfg.add_fields or {}
        if set(added) & NATIVE_FIELDS:
            return None
        try:
            from docket_native import SyslogJson
        except ImportError:
            return None
        suffix = json.dumps(added, ensure_ascii=False, separators=(",", ":"))[1:-1]
        return SyslogJson(list(FACILITIES), list(SEVERITIES), "," + suffix if suffix else "")

    def _natively(self, messages: list[bytes], peers: list[str] | str, senders: list[str],
                  read_ms: int, offset_s: int, now: datetime) -> list[bytes]:
        """The JSON objects of ``messages``, made by the native extension; the few it leaves
        (not printable ASCII, unparsable, an odd time) made by ``_fields`` as without it."""
        if isinstance(peers, str):
            texts = [self._peer_text(peers)]
        else:
            texts = [self._peer_text(p) for p in senders]
        records = self._native.render(messages, texts, read_ms * 1000, offset_s)
        if None in records:
            for i, r in enumerate(records):
                if r is None:
                    records[i] = json.dumps(self._fields(messages[i], senders[i], now),
                                            ensure_ascii=False, separators=(",", ":")).encode()
        return records

    def _peer_text(self, peer: str) -> str:
        text = self._peer_json.get(peer)
        if text is None:
            if len(self._peer_json) > 4096:       # senders come and go: keep it small
                self._peer_json.clear()
            text = self._peer_json[peer] = json.dumps(peer, ensure_ascii=False)
        return text

    def _append(self, topic: str, records: list[bytes], keys: list[bytes | None] | None,
                read_ms: int, nbytes: int) -> None:
        chunk = Chunk.of_values(records, read_ms, keys)
        if self.cfg.timestamp_field or self.cfg.key_field:
            chunk, unparsable, _ = apply_fields(chunk, self.cfg.timestamp_field,
                                                self.cfg.key_field)
            if unparsable:
                self._bad("timestamp_unparsable", unparsable)
        self.feed.append(chunk, nbytes, topic)

    def _fields(self, message: bytes, peer: str, now: datetime) -> dict:
        try:
            fields = parse(message, now, now.tzinfo)
        except Unparsable as exc:
            self._bad("syslog_unparsable")
            fields = {"message": message.decode("utf-8", errors="replace"),
                      "parse_error": str(exc)}
        if not message.isascii():
            try:
                message.decode("utf-8")
            except UnicodeDecodeError:
                self._bad("invalid_utf8")
        fields["peer"] = peer
        if self.cfg.add_fields:
            fields.update(self.cfg.add_fields)
        return fields

    def _bad(self, kind: str, count: int = 1) -> None:
        self.metrics.inc("agent_source_bad_input_total", count, kind=kind, topic=self.label)

    # -- TCP -------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        accept_each(self.sock, self._stop, self._threads, "docket-syslog-conn",
                    lambda conn, addr: self._serve_guarded(conn, _peer(addr)))

    def _serve_guarded(self, conn: socket.socket, peer: str) -> None:
        try:
            self._serve(conn, peer)
        except Exception:                 # the connection ends; the listener and the rest go on
            log.exception("syslog source %d: reading the connection from %s failed; closed",
                          self.cfg.index, peer)
            conn.close()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        frames = Frames(MAX_LINE_BYTES)
        bad = cut = 0
        conn.settimeout(0.2)
        if self._tls is not None:
            conn = self._handshake(conn, peer)
            if conn is None:
                return
        with conn:
            for data in reads(conn, self._stop, peek=self._tls is None):
                whole = frames.feed(data)
                if frames.bad_frames > bad:
                    self._bad("syslog_bad_frame", frames.bad_frames - bad)
                    bad = frames.bad_frames
                if frames.cut > cut:
                    self._bad("line_forced", frames.cut - cut)
                    cut = frames.cut
                if whole:
                    self._deliver(whole, peer)
            if self._stop.is_set():           # what the kernel still holds for it goes too
                whole = frames.feed(left_in(conn))
                if whole:
                    self._deliver(whole, peer)
            rest = frames.rest()
            if rest.strip(b"\r\n\x00 "):  # the sender closed, or the agent stops, mid-frame
                self._bad("partial_line_flushed")
                self._deliver([rest], peer)

    def _handshake(self, conn: socket.socket, peer: str) -> ssl.SSLSocket | None:
        conn.settimeout(10)
        try:
            tls = self._tls.wrap_socket(conn, server_side=True)
        except OSError as exc:                # ssl.SSLError is one
            self._bad("tls_refused")
            log.warning("syslog source %d: TLS handshake with %s failed: %s", self.cfg.index,
                        peer, exc)
            conn.close()
            return None
        tls.settimeout(0.2)
        return tls

    # -- UDP -------------------------------------------------------------------------------
    def _receive_loop(self) -> None:
        anc = socket.CMSG_SPACE(4)
        last_journal = time.monotonic()
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.2)
                if ready:
                    self._receive_batch(anc)
            except Exception:
                if self._stop.is_set():
                    break
                log.exception("syslog source %d: receiving datagrams failed; going on",
                              self.cfg.index)
                self._stop.wait(1)
            if time.monotonic() - last_journal >= JOURNAL_EVERY_S:
                self._journal_drops()
                last_journal = time.monotonic()
        try:                                  # stopping: what the socket still holds goes too
            while self._receive_batch(anc) == BATCH_DATAGRAMS:
                pass
        except Exception:
            log.exception("syslog source %d: the datagrams left at the stop were not read",
                          self.cfg.index)
        self._journal_drops()

    def _receive_batch(self, anc: int) -> int:
        """The datagrams waiting, up to a batch, appended (what was received before an error
        too); returns how many."""
        frames: list[bytes] = []
        peers: list[str] = []
        try:
            while len(frames) < BATCH_DATAGRAMS:
                data, cmsgs, _flags, addr = self.sock.recvmsg(DATAGRAM_BYTES, anc)
                self._note_drops(cmsgs)
                frames.append(data)
                peers.append(_peer(addr))
        except BlockingIOError:
            pass
        finally:
            if frames:
                self._deliver(frames, peers)
        return len(frames)

    def _note_drops(self, cmsgs) -> None:
        for level, kind, data in cmsgs:
            if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
                total = struct.unpack("=I", data[:4])[0]
                new = (total - self._drops_seen) & 0xFFFFFFFF
                if new:
                    self._drops_seen = total
                    self._drops_unjournalled += new
                    self.metrics.inc("agent_source_udp_dropped_total", new, topic=self.label)

    def _journal_drops(self) -> None:
        n, self._drops_unjournalled = self._drops_unjournalled, 0
        if n and not self.feed.abandoned:
            self.journal.record("udp_dropped", self.label, n,
                                source=f"udp {self.cfg.listen}",
                                detail=f"{n} syslog datagram(s) dropped by the kernel: the "
                                "socket's receive buffer was full (raise receive_buffer_bytes, "
                                "or send over TCP)")

    def describe(self) -> dict:
        """For ``/status``: where it listens, how, its open connections and the drops, and
        whether the native extension makes its JSON objects."""
        out = {"source": self.cfg.index, "type": "syslog", "protocol": self.cfg.protocol,
               "listen": self.cfg.listen, "tls": self._tls is not None,
               "topic": self.cfg.topic}
        if self.cfg.format == "json":         # who makes the JSON objects
            out["json"] = "python" if self._native is None else "native"
        if self.cfg.protocol == "tcp":
            out["connections"] = sum(1 for t in self._threads if t.is_alive())
        else:
            out["udp_dropped"] = self._drops_seen
        return out

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: stop listening, appending and journalling nothing
        more (what the threads had read dies with them)."""
        self.feed.abandoned = True
        self.close()

    def close(self) -> None:
        """Stop listening: what each connection's kernel buffer and the UDP socket still hold,
        and a frame a sender left unended, are read and appended first (the pool's room
        allowing: ``PoolFeed``)."""
        self._stop.set()
        if self.cfg.protocol == "tcp":
            self.sock.close()                 # no new connections
        self._main.join(timeout=5)
        for t in self._threads:
            t.join(timeout=5)
        self.sock.close()


def _listen(cfg: SourceConfig) -> socket.socket:
    """The source's bound socket (TCP: listening, with a 0.2 s timeout; UDP: non-blocking, the
    kernel's drop count asked for); any failure a ``StartupError`` saying why."""
    host, port = split_listen(cfg.listen)
    sock = None
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_STREAM if cfg.protocol == "tcp" else socket.SOCK_DGRAM)
        if cfg.protocol == "tcp":   # (not UDP: two sockets would share the port, one unheard)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if cfg.receive_buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cfg.receive_buffer_bytes)
        sock.bind((host, port))
        if cfg.protocol == "tcp":
            sock.listen(128)
            sock.settimeout(0.2)
        else:
            sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
            sock.setblocking(False)
        return sock
    except Exception as exc:
        if sock is not None:
            sock.close()
        raise StartupError(
            f"sources[{cfg.index}]: cannot listen for syslog on {cfg.protocol} {cfg.listen}: "
            f"{getattr(exc, 'strerror', None) or exc}",
            hint="another process holds that port (ss -lntup), or ports below 1024 need "
            "CAP_NET_BIND_SERVICE: choose a port above 1024 or grant it in the unit "
            "(AmbientCapabilities=CAP_NET_BIND_SERVICE)") from None


def _peer(addr) -> str:
    return addr[0] if isinstance(addr, tuple) else str(addr)


def _tls_context(cfg: SourceConfig) -> ssl.SSLContext | None:
    if not cfg.ssl_certificate_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        password = read_secret(f"sources[{cfg.index}].ssl_key_password_file",
                                cfg.ssl_key_password_file) if cfg.ssl_key_password_file else None
        ctx.load_cert_chain(cfg.ssl_certificate_file, cfg.ssl_key_file, password=password)
        if cfg.ssl_ca_file:
            ctx.load_verify_locations(cfg.ssl_ca_file)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ConfigError) as exc:     # (ssl.SSLError is an OSError)
        raise StartupError(f"sources[{cfg.index}]: the syslog listener's TLS files do not "
                           f"load: {exc}",
                           hint="ssl_certificate_file and ssl_key_file: PEM, the key matching "
                           "the certificate; ssl_ca_file: the CA of the clients' "
                           "certificates") from None
    return ctx
