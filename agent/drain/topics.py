"""Which of the agent's topics the cluster does not have.

Checked at start and every ``CHECK_S`` from a thread of its own (a metadata request for all
topics, which never creates one), and at once when a delivery report says a topic is unknown
(which a leader moving can say too: only the metadata decides).
Whether the cluster creates topics on first use is read from a broker's
``auto.create.topics.enable``: where it does, a missing topic is only noted (its first event
creates it, with the broker's default partitions and retention; ``docs/broker.md`` says how to
create topics with settings of their own); where it does not, or when the answer is unknown,
the topic is named in a WARNING and in status, and its events wait in the pool until it exists.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

log = logging.getLogger("docket.agent.topics")

CHECK_S = 30.0
REQUEST_TIMEOUT_S = 10.0
# librdkafka properties an admin client needs from the producer's: how to reach and
# authenticate to the cluster. (Producer-only properties would make it log a warning each.)
_CONNECTION_PREFIXES = ("bootstrap.servers", "security.", "sasl.", "ssl.", "ssl_", "https.",
                        "socket.",
                        "broker.", "client.", "metadata.", "reconnect.", "api.version",
                        "resolve.", "connections.", "enable.ssl", "enable.sasl")


def connection_conf(conf: dict) -> dict:
    return {k: v for k, v in conf.items()
            if isinstance(k, str) and k.startswith(_CONNECTION_PREFIXES)}


class TopicWatch:
    def __init__(self, conf: dict, topics: Callable[[], list[str]], check_s: float = CHECK_S,
                 on_answer: Callable[[], None] | None = None):
        self.conf = connection_conf(conf)
        self.topics = topics
        self.check_s = check_s
        self.on_answer = on_answer                 # the cluster answered a check
        self.missing: list[str] = []
        self.auto_create: bool | None = None       # the cluster's, once read
        self.checked = False                       # a check has been answered
        self._auto_create_asked = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._admin: AdminClient | None = None
        self._new_conf: dict | None = None     # a reload's, taken by the check's thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="docket-topics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Not waited for: a check under way against a cluster that does not answer would
        hold the stop for its whole timeout (the thread is a daemon)."""
        self._stop.set()
        self._wake.set()

    def reconfigure(self, conf: dict) -> None:
        """New client settings (a reload): the next check uses a new admin client."""
        self._new_conf = connection_conf(conf)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._new_conf is not None:
                self.conf, self._new_conf, self._admin = self._new_conf, None, None
            unanswered = False
            try:
                self.check()
            except KafkaException as exc:
                log.debug("topic check: the cluster did not answer (%s)", exc)
                unanswered = True
            except Exception as exc:                # never let the check's thread die
                log.warning("topic check failed: %r", exc)
            finally:
                if self._admin is not None:
                    self._admin.poll(0)            # hand its log lines to the logger
                if unanswered:      # the next check asks with a new client: one left without
                    self._admin = None      # a broker would never answer again
            self._wake.wait(self.check_s)
            self._wake.clear()
        self._admin = None                          # stopped: its client goes with the thread

    def check(self) -> list[str]:
        if self._admin is None:
            self._admin = AdminClient(self.conf,
                                      logger=logging.getLogger("docket.agent.librdkafka"))
        md = self._admin.list_topics(timeout=REQUEST_TIMEOUT_S)
        if self.on_answer is not None:
            self.on_answer()
        if not self._auto_create_asked and md.brokers:
            self._auto_create_asked = True          # asked once: a refusal is not retried
            self.auto_create = self._read_auto_create(min(md.brokers))
        present = {name for name, t in md.topics.items() if t.error is None}
        self._set(sorted(set(self.topics()) - present))
        self.checked = True
        return self.missing

    def _read_auto_create(self, broker_id: int) -> bool | None:
        resource = ConfigResource(ResourceType.BROKER, str(broker_id))
        try:
            configs = self._admin.describe_configs([resource])[resource].result(
                timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:               # not authorised to read it, an old broker
            log.info("cannot read the cluster's auto.create.topics.enable (%s): missing "
                     "topics are warned about", exc)
            return None
        entry = configs.get("auto.create.topics.enable")
        return None if entry is None else str(entry.value).lower() == "true"

    def unknown(self, topic: str) -> None:
        """A delivery report said the cluster does not know ``topic``: check now."""
        if topic not in self.missing:
            self._wake.set()

    def _set(self, missing: list[str]) -> None:
        with self._lock:
            before, self.missing = set(self.missing), missing
        for topic in sorted(set(missing) - before):
            if self.auto_create:
                log.info("topic %s does not exist yet: the cluster creates it with its "
                         "first event (broker defaults for partitions and retention)", topic)
            else:
                log.warning("topic %s does not exist on the cluster%s: its events wait in the "
                            "pool until it is created (docket-broker topic ensure, or the "
                            "cluster's kafka-topics.sh --create); checked every %.0f s", topic,
                            " (auto.create.topics.enable=false)" if self.auto_create is False
                            else "", self.check_s)
        for topic in sorted(before - set(missing)):
            log.info("topic %s exists now", topic)
