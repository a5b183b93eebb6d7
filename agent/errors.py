"""The agent's own errors that stop it before it sends anything."""

from __future__ import annotations

from docket_common.errors import DocketError


class StartupError(DocketError):
    """The agent cannot start here (a port, the state folder's lock): nothing was sent."""
