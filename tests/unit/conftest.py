"""Fixtures of the unit tests alone."""

from __future__ import annotations

import pytest

from tests.unit import poolkit


@pytest.fixture(params=["python", "native"])
def send_path(request):
    """Run the test with each send path of the drain (``poolkit.sealed_drain`` builds it)."""
    poolkit.SEND_PATH = request.param
    try:
        yield request.param
    finally:
        poolkit.SEND_PATH = "python"
