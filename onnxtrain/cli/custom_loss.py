"""A loss of the user's for ``onnxtrain generate --loss``: a Block class, ``module:Class`` or ``path/to/loss.py:Class``.

The class is an ``onnxtrain.onnxblock.Block`` made without arguments; its
``build(self, *model_outputs: str) -> str`` receives the names of the model
outputs the loss reads (``--loss-inputs``, default all, in order) and returns
the name of the loss, a scalar. The targets it compares with are new inputs
of the training model, which the built-in losses add when given a name the
model does not have yet (``onnxblock.loss.MSELoss()(output, "target")``);
``onnxtrain train --data`` then provides them.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from onnxtrain.cli.common import CommandError

if TYPE_CHECKING:
    from onnxtrain.blocks import Block

#: What separates the module or file from the class: ``losses.focal:FocalLoss``, ``./loss.py:MyLoss``.
SEPARATOR = ":"


def names_a_class(text: str) -> bool:
    """Whether ``text`` is ``module:Class`` or ``path.py:Class`` rather than a built-in loss's name."""
    where, _, name = text.rpartition(SEPARATOR)
    return bool(where) and name.isidentifier()


def custom_loss(text: str) -> Block:
    """A new instance of the loss class ``text`` names; ``CommandError``/``TypeError`` saying what to fix."""
    from onnxtrain.blocks import Block

    where, _, name = text.rpartition(SEPARATOR)
    module = _module(where, text)
    found = getattr(module, name, None)
    if found is None:
        defined = sorted(
            key for key, value in vars(module).items() if inspect.isclass(value) and issubclass(value, Block)
        )
        known = f"its Block classes are {defined}" if defined else "it defines no Block class"
        raise CommandError(f"--loss {text}: {where} has no {name!r}; {known}")
    if not (inspect.isclass(found) and issubclass(found, Block)):
        raise TypeError(
            f"--loss {text}: {name} is a {type(found).__name__}, not a Block class; the loss is a subclass of "
            "onnxtrain.onnxblock.Block whose build(*model_outputs) returns the name of the loss"
        )
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [
        parameter.name
        for parameter in inspect.signature(found).parameters.values()
        if parameter.default is parameter.empty and parameter.kind in named
    ]
    if required:
        raise TypeError(
            f"--loss {text}: {name}() needs {', '.join(required)}, but generate makes it without arguments: give "
            f"them defaults, or a subclass that sets them"
        )
    return found()


def _module(where: str, text: str) -> ModuleType:
    """The module ``where`` names: a ``.py`` file (or a path), else an importable module."""
    if where.endswith(".py") or "/" in where or "\\" in where:
        return _module_from_file(Path(where), text)
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as error:
        if error.name is None or not where.startswith(error.name):
            raise  # the module was found; something it imports is missing
        raise CommandError(
            f"--loss {text}: no module {where!r} to import; give a module on the Python path, or the file: "
            f"path/to/{where.rpartition('.')[2]}.py:{text.rpartition(SEPARATOR)[2]}"
        ) from None


def _module_from_file(path: Path, text: str) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"--loss {text}: no Python file {str(path)!r}")
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"onnxtrain_user_loss_{digest}"  # one name per file: loading it twice gives the same module
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise CommandError(f"--loss {text}: {path} cannot be loaded as a Python module; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does, so that dataclasses and pickling find it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


__all__ = ["SEPARATOR", "custom_loss", "names_a_class"]
