"""Finite-difference specs of the rules in ``onnxtrain/autodiff/rules/control_flow.py`` (see ``specs.py``)."""

from __future__ import annotations

from tests.autodiff.specs import Spec

SPECS: list[Spec] = []
