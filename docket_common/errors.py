"""The base of every docket error, and the one function that prints them at the command line.

The core raises named exceptions; only the edges (the CLIs) format them, through
:func:`print_error`: the message, then what to do about it on a line of its own. The base lives
on the ground floor because every docket host installs ``docket_common`` (agent hosts install
neither ``broker/``'s cluster tooling nor the Spark jobs).

The tree (``tests/unit/test_error_tree.py`` holds it against the classes)::

    DocketError
    ├── ConfigError                   docket_common.settings
    │   └── ChannelConfigError        audit.reconcile.channel_settings
    ├── StartupError                  agent.errors
    │   ├── StateDirLocked            agent.service
    │   └── StateFolderRefused        agent.state.folder
    ├── PoolError                     agent.buffer.errors
    │   ├── PoolBusy                  agent.buffer.errors
    │   ├── PoolCorrupt               agent.buffer.errors
    │   ├── PoolDiskTooSmall          agent.buffer.errors
    │   ├── PoolFormatError           agent.buffer.errors
    │   │   └── PoolDamaged           agent.buffer.errors
    │   └── PoolGeometryMismatch      agent.buffer.errors
    ├── BrokerError                   broker.errors
    │   ├── ClusterAlreadyRunning     broker.errors
    │   ├── ClusterStartFailed        broker.errors
    │   ├── KafkaLibsMissing          broker.errors
    │   ├── PortBusy                  broker.errors
    │   ├── SecuritySetupFailed       broker.errors
    │   └── TopicConflict             broker.errors
    ├── AuditError                    audit.contract.errors
    │   ├── BrokerUnreachable         audit.contract.errors
    │   ├── MalformedRecord           audit.contract.errors
    │   ├── JvmBuildFailed            audit.jobs.jvm
    │   ├── LandingError              audit.jobs.landing
    │   ├── SparkJobError             audit.jobs.spark
    │   ├── SparkLibsMissing          audit.jobs.sparklibs
    │   ├── TallyError                audit.jobs.tally
    │   ├── MetricsListenError        audit.reconcile.metrics
    │   └── StoreMissing              audit.reconcile.store
    └── DashboardError                dashboards.cli
"""

from __future__ import annotations

import sys


class DocketError(Exception):
    """A failure that says what is wrong (the message) and what to do about it (``hint``)."""

    hint: str = ""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.hint = hint

    def render(self, prefix: str = "") -> str:
        """The message (after ``prefix: `` when given), and the hint on a line of its own."""
        text = f"{prefix}: {self}" if prefix else str(self)
        return text + (f"\n  hint: {self.hint}" if self.hint else "")


def print_error(exc: DocketError, prefix: str = "") -> None:
    """Print ``exc`` to stderr for the person at the command line: message, then hint."""
    print(exc.render(prefix), file=sys.stderr)
