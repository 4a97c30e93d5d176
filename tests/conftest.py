"""Test configuration: Hypothesis profiles and shared fixtures.

Profiles: ``ci`` (default; few, derandomized examples) and ``dev`` (more
examples). Choose one with the ``HYPOTHESIS_PROFILE`` environment variable.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `import tests.helpers` from anywhere

settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def run_model():
    """The :func:`tests.helpers.run_model` helper, as a fixture."""
    from tests.helpers import run_model

    return run_model


@pytest.fixture
def make_model():
    """The :func:`tests.helpers.make_model` helper, as a fixture."""
    from tests.helpers import make_model

    return make_model
