"""Specs for the matrix products and shape/data-movement operators (rules/matrix.py, rules/shape.py); see specs.py for the format."""

from __future__ import annotations

from tests.autodiff.specs import Spec

SPECS: list[Spec] = []
