"""Warnings attributed to the user's code: the innermost frame outside the onnxtrain package.

A warning raised deep in generation or training names, by default, the line
of onnxtrain that raised it; a fixed ``stacklevel`` names the right line only
from the entry point it was counted from. :func:`warn` counts the frames up
to the first one outside the package at every call, so the warning names the
line of the user's script (or test) that led to it, whichever entry point.
"""

from __future__ import annotations

import os
import sys
import warnings

#: The package's folder, with a trailing separator: frames of files under it are onnxtrain's.
PACKAGE_FOLDER = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str | Warning, category: type[Warning] | None = None) -> None:
    """``warnings.warn(message, category)``, attributed to the innermost caller outside onnxtrain."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2: warn's caller
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE_FOLDER):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


__all__ = ["PACKAGE_FOLDER", "warn"]
