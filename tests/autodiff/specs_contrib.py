"""Finite-difference specs of the rules in ``onnxtrain/autodiff/rules/contrib.py`` (see ``specs.py``)."""

from __future__ import annotations

from tests.autodiff.specs import Spec

SPECS: list[Spec] = []
