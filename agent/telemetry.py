"""The agent's metrics, named once here and described in docs/telemetry.md.

Names follow ``agent_<subsystem>_<name>_<unit>[_total]``. Dropped events carry ``reason`` and
``intentional``; retried events are counted as retried, never as dropped. ``/metrics`` renders
the Prometheus text format (integers exactly, other values with every digit: see ``sample``);
``/status`` and ``docket-agent status`` read ``snapshot()``.
"""

from __future__ import annotations

import threading
from collections import defaultdict

# name → (type, help). The single list of what the agent measures.
METRICS: dict[str, tuple[str, str]] = {
    "agent_source_read_bytes_total": ("counter", "Bytes read from sources."),
    "agent_source_read_events_total": ("counter", "Events accepted into the buffer pool."),
    "agent_source_bad_input_total": ("counter", "Input oddities, by kind; the events still ship "
                                     "unless a drop says otherwise."),
    "agent_source_rotations_total": ("counter", "File rotations seen, by kind."),
    "agent_source_rewound_total": ("counter", "Generations whose sealed checkpoint went back at "
                                   "start: bytes sealed, not acknowledged and not in the pool "
                                   "(read again)."),
    "agent_source_journal_read_again_total": (
        "counter", "journald entries that came without a message, read again by their cursor, "
        "by outcome: `whole` (journalctl had skipped the message of an entry being written), "
        "`none` (the entry has none: shipped as its fields), `unread` (journalctl did not "
        "print it again: in 10 s, or it failed; shipped as its fields)."),
    "agent_source_udp_dropped_total": ("counter", "Syslog datagrams the kernel dropped (the "
                                       "socket's receive buffer full), as the kernel counts "
                                       "them; journalled each minute as `udp_dropped`."),
    "agent_source_files": ("gauge", "Files being tailed."),
    "agent_source_lag_bytes": ("gauge", "Per file, bytes written but not yet read."),
    "agent_buffer_size_bytes": ("gauge", "Size of the pool file."),
    "agent_clock_steps_total": ("counter", "Steps of the wall clock seen (more than 2 s off the "
                                "monotonic clock's progress in a second)."),
    "agent_disk_full": ("gauge", "1 while reading is paused for lack of space on the state "
                        "folder's file system (below `agent.disk_reserve_bytes`, or a write "
                        "refused), else 0."),
    "agent_state_free_bytes": ("gauge", "Free bytes on the state folder's file system, as last "
                               "looked at."),
    "agent_buffer_oversize_lines_total": ("counter", "Lines longer than a record, by policy "
                                          "(split, truncate, drop)."),
    "agent_buffer_quarantined_slots_total": ("counter", "Slots that failed their CRC at start "
                                             "and were copied to quarantine/."),
    "agent_buffer_slots": ("gauge", "Pool slots by state: free, filling, sealed (waiting), "
                           "in_flight (being sent); these add up to the pool's slots. spilled: "
                           "sealed slots on disk outside the pool."),
    "agent_buffer_backlog_bytes": ("gauge", "Bytes of the backlog (sealed and filling slots) "
                                   "not yet acknowledged."),
    "agent_buffer_backlog_events": ("gauge", "Events accepted and not yet acknowledged (sealed "
                                    "and filling slots): events read minus events sent, drops "
                                    "aside."),
    "agent_buffer_oldest_unacked_age_seconds": ("gauge", "Age of the oldest sealed slot not yet "
                                                "acknowledged by Kafka."),
    "agent_drain_sent_events_total": ("counter", "Events acknowledged by Kafka."),
    "agent_drain_retried_events_total": ("counter", "Events sent again after a retriable error."),
    "agent_drain_skipped_acknowledged_total": ("counter", "Events of slots found in the pool at "
                                               "start not sent again: Kafka acknowledged them "
                                               "before the stop (the slot's acknowledged "
                                               "prefix)."),
    "agent_drain_found_delivered_total": ("counter", "Events of slots found in the pool at start, "
                                          "past their acknowledged prefix, not sent again: the "
                                          "start's check found them in Kafka (same origin, "
                                          "incarnation, record number and value)."),
    "agent_drain_slots_freed_total": ("counter", "Slots freed after full acknowledgement."),
    "agent_drain_broker_up": ("gauge", "1 while the cluster answers, 0 during an outage."),
    "agent_drain_transactions_committed_total": ("counter", "exactly_once: transactions "
                                                 "committed."),
    "agent_drain_transactions_aborted_total": ("counter", "exactly_once: transactions aborted "
                                               "(their slots sent again in the next one)."),
    "agent_drain_committed_found_total": ("counter", "exactly_once: slots found committed by "
                                          "the last transaction at a start or a new producer, "
                                          "freed without sending them again."),
    "agent_drain_outages_total": ("counter", "Outages detected (librdkafka queue purged, pool "
                                  "absorbing)."),
    "agent_drain_producer_replacements_total": ("counter", "Producers replaced, by reason: "
                                                "stalled (nothing acknowledged while the "
                                                "cluster answers), fatal, settings (a reload), "
                                                "and exactly_once's own."),
    "agent_drain_unacknowledged_seconds": ("gauge", "Seconds since the last delivery report "
                                           "while records are out at the producer (0 when "
                                           "none are)."),
    "agent_dropped_events_total": ("counter", "Events not delivered, by reason and whether a "
                                   "policy chose it (intentional)."),
    "agent_dropped_bytes_total": ("counter", "Bytes not delivered, by reason."),
    "agent_loss_journal_entries_total": ("counter", "Entries written to the loss journal, by "
                                         "reason and whether their event count is known "
                                         "(size=unknown: a possible loss of unknown size)."),
    "agent_audit_emitted_records_total": ("counter", "Audit records acknowledged by Kafka."),
    "agent_audit_emit_failures_total": ("counter", "Audit rounds with records Kafka did not "
                                        "acknowledge (sent again next round)."),
    "agent_audit_last_emission_timestamp_seconds": ("gauge", "When the last audit round ran "
                                                    "(Unix time)."),
}


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple, float]] = defaultdict(dict)

    def inc(self, name: str, value: float = 1, **labels) -> None:
        assert name in METRICS, name
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values[name]
            series[key] = series.get(key, 0) + value

    def set(self, name: str, value: float, **labels) -> None:
        assert name in METRICS, name
        with self._lock:
            self._values[name][tuple(sorted(labels.items()))] = value

    def clear(self, name: str) -> None:
        with self._lock:
            self._values[name].clear()

    def dropped(self, reason: str, topic: str, events: int, intentional: bool,
                nbytes: int = 0) -> None:
        flag = "true" if intentional else "false"
        self.inc("agent_dropped_events_total", events, reason=reason, topic=topic,
                 intentional=flag)
        if nbytes:
            self.inc("agent_dropped_bytes_total", nbytes, reason=reason, topic=topic)

    def get(self, name: str, **labels) -> float:
        with self._lock:
            series = self._values.get(name, {})
            if labels:
                return series.get(tuple(sorted(labels.items())), 0)
            return sum(series.values())

    def total(self, name: str, **labels) -> float:
        """The sum over every series of ``name`` that carries ``labels`` (and any others)."""
        want = set(labels.items())
        with self._lock:
            return sum(v for key, v in self._values.get(name, {}).items() if want <= set(key))

    def by(self, name: str, label: str) -> dict[str, float]:
        """The series of ``name`` summed per value of ``label``."""
        out: dict[str, float] = {}
        with self._lock:
            for key, v in self._values.get(name, {}).items():
                value = dict(key).get(label)
                out[value] = out.get(value, 0) + v
        return out

    def snapshot(self) -> dict[str, list[dict]]:
        with self._lock:
            return {name: [{"labels": dict(k), "value": v} for k, v in series.items()]
                    for name, series in self._values.items() if series}

    def prometheus(self) -> str:
        out = []
        with self._lock:
            for name, (kind, help_text) in METRICS.items():
                out.append(f"# HELP {name} {help_text}")
                out.append(f"# TYPE {name} {kind}")
                for key, value in sorted(self._values.get(name, {}).items()):
                    labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in key)
                    shown = sample(value)
                    out.append(f"{name}{{{labels}}} {shown}" if labels else f"{name} {shown}")
        return "\n".join(out) + "\n"


def sample(value: float) -> str:
    """A sample value as Prometheus clients print it: an integer exactly (a byte counter at
    2,265,270 is not ``2.26527e+06``), any other float with every digit ``repr`` keeps (a Unix
    time to the millisecond), and ``+Inf`` / ``-Inf`` / ``NaN``."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
