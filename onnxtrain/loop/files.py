"""The files of an artifact directory, as ``generate_artifacts`` writes them and a training run adds to them."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The checkpoint a training run writes (and resumes from); ``checkpoint`` stays the initial state.
TRAINED_CHECKPOINT = "trained_checkpoint"
#: The state after the epoch with the lowest validation loss, kept by a run with early stopping.
BEST_CHECKPOINT = "best_checkpoint"


@dataclass(frozen=True)
class ArtifactFiles:
    """The paths of the artifacts in ``directory`` (each file name after ``prefix``)."""

    directory: Path
    prefix: str = ""

    @classmethod
    def at(cls, directory: str | os.PathLike[str], prefix: str = "") -> ArtifactFiles:
        """The artifact set in ``directory``; ``NotADirectoryError``/``FileNotFoundError`` when there is none."""
        path = Path(directory)
        if not path.exists():
            raise FileNotFoundError(f"no artifact directory {str(path)!r}: create one with `onnxtrain generate`")
        if not path.is_dir():
            raise NotADirectoryError(f"{str(path)!r} is not a directory; give the folder `onnxtrain generate` wrote")
        return cls(path, prefix)

    def _file(self, name: str) -> Path:
        return self.directory / f"{self.prefix}{name}"

    @property
    def training_model(self) -> Path:
        return self._file("training_model.onnx")

    @property
    def eval_model(self) -> Path:
        return self._file("eval_model.onnx")

    @property
    def optimizer_model(self) -> Path:
        return self._file("optimizer_model.onnx")

    @property
    def checkpoint(self) -> Path:
        """The initial state, as ``generate_artifacts`` wrote it."""
        return self._file("checkpoint")

    @property
    def trained_checkpoint(self) -> Path:
        """The state of the latest training run (parameters, optimizer state, where the run stands)."""
        return self._file(TRAINED_CHECKPOINT)

    @property
    def best_checkpoint(self) -> Path:
        """With early stopping: the state after the epoch with the lowest validation loss (and its record)."""
        return self._file(BEST_CHECKPOINT)

    def latest_checkpoint(self) -> Path:
        """The trained checkpoint when there is one, else the initial checkpoint."""
        return self.trained_checkpoint if self.trained_checkpoint.exists() else self.checkpoint

    def require(self, *paths: Path) -> None:
        """``FileNotFoundError`` naming every one of ``paths`` that is missing."""
        missing = [path.name for path in paths if not path.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{self.directory} lacks {', '.join(missing)}: is it a folder written by `onnxtrain generate`"
                + (f" with --prefix {self.prefix!r}" if self.prefix else "")
                + "?"
            )


def remove_checkpoint(path: Path) -> None:
    """Remove the checkpoint at ``path``: the file, its data file and the hidden versions they link to."""
    from onnxtrain.checkpoint.files import checkpoint_files

    group = checkpoint_files(path)
    with group.locked():
        for name in group.names:  # the checkpoint first: without it, a data file left by a crash is never read
            member = group.directory / name
            if os.path.lexists(member):
                os.unlink(member)
        group.release_unused()


__all__ = ["BEST_CHECKPOINT", "TRAINED_CHECKPOINT", "ArtifactFiles", "remove_checkpoint"]
