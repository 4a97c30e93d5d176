"""``python -m onnxtrain``: the ``onnxtrain`` command (:mod:`onnxtrain.cli`)."""

from __future__ import annotations

import sys

from onnxtrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
