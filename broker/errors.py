"""Named failures of the broker package; the CLI turns them into one clear line each."""

from docket_common.errors import DocketError


class BrokerError(DocketError):
    """Base class: something about the local cluster or a topic is not as asked."""


class KafkaLibsMissing(BrokerError):
    """The Kafka jars are not in the cache and could not be fetched."""


class PortBusy(BrokerError):
    """A port the cluster needs is already taken by another process."""


class ClusterAlreadyRunning(BrokerError):
    """The data directory already holds a running cluster."""


class ClusterStartFailed(BrokerError):
    """A broker exited or did not answer metadata requests in time."""


class TopicConflict(BrokerError):
    """A topic exists with settings that differ from the ones asked for."""


class SecuritySetupFailed(BrokerError):
    """The secured cluster's certificates or users could not be made, or are incomplete."""
