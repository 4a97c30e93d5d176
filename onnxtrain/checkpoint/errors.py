"""The one exception the checkpoint loader raises."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded: corrupt, truncated, or not a checkpoint.

    Raised by :func:`onnxtrain.checkpoint.load` for *every* problem with the
    file's contents (bad file identifier, unsupported version, an offset or a
    length outside the file, a tensor whose data does not match its shape, an
    unknown element type, ...), with a message naming what is wrong. Missing
    files raise ``FileNotFoundError`` as usual. A subclass of ``ValueError``.
    """
