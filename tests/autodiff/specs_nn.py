"""Specs for the neural-network operators (rules/nn.py); see specs.py for the format."""

from __future__ import annotations

from tests.autodiff.specs import Spec

SPECS: list[Spec] = []
