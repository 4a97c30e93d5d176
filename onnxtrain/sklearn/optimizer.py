"""``OrtGradientOptimizer``: train a model with a loss output in a scikit-learn-style ``fit`` (onnxcustom's class).

One iteration is a pass over the data in shuffled mini-batches. Each batch
runs one train step and one optimizer step on onnxtrain's runtime
(``onnxtrain.api.Module`` and ``Optimizer`` over artifacts built in memory).
The loss output is a sum over the batch (``add_loss_output``'s scores); the
training model divides it by the batch's rows, so every optimizer steps on
the mean gradient with ``eta``: SGD's step is ``eta / batch size`` times the
summed gradient, as in onnxcustom and scikit-learn, and a momentum or Adam's
moments average gradients of one scale whatever the size of the last batch.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from onnxtrain import distributed, optim
from onnxtrain.artifacts import build_artifacts
from onnxtrain.autodiff import MissingGradientError
from onnxtrain.blocks import Block
from onnxtrain.graph import dtypes
from onnxtrain.graph.naming import unknown_name_hint
from onnxtrain.losses._common import dim_size
from onnxtrain.losses.label_check import LABEL_ADVICE
from onnxtrain.progress import Progress
from onnxtrain.sklearn.converted import with_converter_hints
from onnxtrain.sklearn.frames import as_numbers
from onnxtrain.sklearn.learning_rate import BaseLearningRate, LearningRateSGDNesterov
from onnxtrain.sklearn.weights import not_weights, trainable_weights
from onnxtrain.training import Module, Optimizer, TrainingState
from onnxtrain.training.finite import check_finite_rows, first_non_finite
from onnxtrain.training.ranks import sum_over_ranks

#: Names of ``training_optimizer_name`` (onnxruntime-training's first, then short ones) -> optimizer kind.
OPTIMIZER_NAMES: dict[str, str] = {
    "SGDOptimizer": "sgd",
    "AdamOptimizer": "adam",
    "AdamWOptimizer": "adamw",
    "SGD": "sgd",
    "Adam": "adam",
    "AdamW": "adamw",
}
#: Rows of validation data evaluated in one run.
VALIDATION_CHUNK = 65536


class ConvergenceError(RuntimeError):
    """Training diverged: a loss or a weight became NaN or infinite."""


@dataclass(frozen=True)
class _Inputs:
    """The loss model's user inputs: features, label and (optional) sample weight."""

    features: onnx.ValueInfoProto
    label: onnx.ValueInfoProto
    weight: onnx.ValueInfoProto | None


class OrtGradientOptimizer:
    """Trains the initializers ``weights_to_train`` of ``model_onnx`` to minimise its output ``loss_output_name``.

    onnxcustom's arguments, with the same meaning:

    Args:
        model_onnx: a model whose inputs are the features, the label and
            optionally the sample weight, with a loss output
            (:func:`~onnxtrain.sklearn.add_loss_output` makes one).
        weights_to_train: the initializers to train, e.g. ``trainable_weights(model)`` (the
            initializers the graph reads as weights, not the constants converters store beside them).
        loss_output_name: the loss output (a scalar, summed over the batch).
        max_iter: iterations (passes over the data).
        training_optimizer_name: ``"SGDOptimizer"`` (SGD; with momentum when
            ``learning_rate`` is a :class:`LearningRateSGDNesterov`),
            ``"AdamOptimizer"``, ``"AdamWOptimizer"`` (or ``"SGD"``, ``"Adam"``,
            ``"AdamW"``), or any ``onnxtrain.optim`` optimizer instance.
        batch_size: samples per step (the last batch of an iteration may be smaller).
        learning_rate: a float (``eta0``), a schedule name (``"constant"``,
            ``"invscaling"``, ``"optimal"``), a class name (``"SGD"``,
            ``"Nesterov"``) or a :class:`LearningRateSGD` instance.
        device: ``"cpu"`` or ``"cuda"`` (``"cuda:<id>"``).
        warm_start: start from the weights of the last ``fit`` (or of
            :meth:`set_state`, or the model's own when there was none); else
            the weights are drawn anew (Glorot-uniform for matrices, zeros for
            vectors and scalars), as onnxcustom re-randomised them.
        verbose: 1 draws a progress bar (tqdm), 2 also prints a line per iteration.
        validation_every: validate every ``validation_every`` iterations, or
            every ``int(validation_every * max_iter)`` when below 1.
        saved_gradient: a file to save the training model (the gradient graph) to.
        sample_weight_name: the model's input for per-sample weights.

    Beyond onnxcustom (keyword-only): ``early_stopping`` (stop when the
    validation loss has not improved by ``tol`` for ``n_iter_no_change``
    iterations, validating every iteration, on ``X_val`` or on a
    ``validation_fraction`` of the training data, and keep the best weights),
    and ``random_state`` (initial weights, shuffling, the validation split,
    Dropout's masks),
    and ``distributed``: under ``mpiexec``, every rank calls ``fit`` with the
    same data and trains on its part of every batch of ``batch_size`` rows
    (a multiple of the number of ranks), averaging the ranks' gradients of
    their parts' mean loss (:mod:`onnxtrain.distributed`): the weights of one process's
    ``fit``. Rank 0's random draws (initial weights,
    shuffling) are used everywhere; the rows beyond a multiple of the number
    of ranks are left out of each iteration (at most ``ranks - 1``, drawn
    anew each time).

    After ``fit``: ``train_losses_`` (mean loss per sample of each iteration),
    ``validation_losses_``, ``trained_coef_`` (``{name: array}``), ``n_iter_``,
    ``learning_rate_`` (the schedule object). A NaN or infinite loss raises
    :class:`ConvergenceError` and leaves the weights of the last good iteration.
    """

    def __init__(
        self,
        model_onnx: onnx.ModelProto,
        weights_to_train: Sequence[str],
        loss_output_name: str = "loss",
        max_iter: int = 100,
        training_optimizer_name: str | optim.Optimizer = "SGDOptimizer",
        batch_size: int = 10,
        learning_rate: Any = "invscaling",
        device: str = "cpu",
        warm_start: bool = False,
        verbose: int = 0,
        validation_every: float = 0.1,
        saved_gradient: str | os.PathLike[str] | None = None,
        sample_weight_name: str = "weight",
        *,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        tol: float = 1e-4,
        random_state: int | None = None,
        distributed: bool = False,
    ) -> None:
        self.model_onnx = model_onnx
        self.weights_to_train = weights_to_train
        self.loss_output_name = loss_output_name
        self.max_iter = max_iter
        self.training_optimizer_name = training_optimizer_name
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.device = device
        self.warm_start = warm_start
        self.verbose = verbose
        self.validation_every = validation_every
        self.saved_gradient = saved_gradient
        self.sample_weight_name = sample_weight_name
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.random_state = random_state
        self.distributed = distributed

    # ------------------------------------------------------- scikit-learn's protocol

    @classmethod
    def _get_param_names(cls) -> list[str]:
        parameters = inspect.signature(cls.__init__).parameters.values()
        return [p.name for p in parameters if p.name != "self" and p.kind != p.VAR_KEYWORD]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments (scikit-learn's protocol; ``deep`` changes nothing)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params: Any) -> OrtGradientOptimizer:
        """Change constructor arguments; ``ValueError`` for a name the constructor does not take."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"OrtGradientOptimizer has no parameter {name!r}; its parameters are {valid}")
            setattr(self, name, value)
        return self

    def __sklearn_is_fitted__(self) -> bool:
        """Whether there are trained weights (``fit`` or ``set_state``): scikit-learn's ``check_is_fitted``."""
        return getattr(self, "trained_coef_", None) is not None

    def __sklearn_tags__(self) -> Any:
        """scikit-learn's tags (its model selection asks for them from 1.6 on): an estimator that needs ``y``,
        neither a classifier nor a regressor (it trains a loss, and scores by it)."""
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=True))

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Minus the loss per sample of ``X``, ``y`` at the trained weights (higher is better, as scikit-learn's
        model selection wants): ``-sum(loss) / len(X)``, the loss output summed over runs of
        ``VALIDATION_CHUNK`` rows of the model with the trained weights (a penalty counted once per run, as in
        ``validation_losses_``), ``sample_weight`` weighting the rows where the model takes weights."""
        if not self.__sklearn_is_fitted__():
            raise AttributeError("OrtGradientOptimizer has no trained weights yet: call fit() before score()")
        self._check_params()
        inputs = self._inputs()
        data = self._arrays(inputs, X, y, sample_weight, "X", "y", "score")
        names = [value.name for value in self.model_onnx.graph.input if value.name in _names(inputs)]
        session = ort.InferenceSession(self.get_trained_onnx().SerializeToString(), providers=["CPUExecutionProvider"])
        total, rows = 0.0, len(data[0])
        for start in range(0, rows, VALIDATION_CHUNK):
            feeds = {name: array[start : start + VALIDATION_CHUNK] for name, array in zip(names, data, strict=True)}
            total += float(np.sum(session.run([self.loss_output_name], feeds)[0]))
        return -total / rows

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        shown = []
        for name in self._get_param_names():
            value = getattr(self, name)
            if isinstance(value, onnx.ModelProto):
                shown.append(f"{name}=<ModelProto {value.graph.name!r}>")
            elif defaults[name] is inspect.Parameter.empty or not _same(value, defaults[name]):
                shown.append(f"{name}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    # --------------------------------------------------------------- state

    def get_state(self) -> dict[str, np.ndarray]:
        """The trained weights, ``{name: array}`` (copies)."""
        coef = getattr(self, "trained_coef_", None)
        if coef is None:
            raise AttributeError("OrtGradientOptimizer has no trained weights yet: call fit() or set_state() first")
        return {name: array.copy() for name, array in coef.items()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace trained weights by name; a later ``fit(warm_start=True)`` starts from them."""
        reference = getattr(self, "trained_coef_", None) or self._initial_weights()
        updated = dict(reference)
        for name, value in state.items():
            if name not in reference:
                raise ValueError(f"set_state: {name!r} is not a trained weight; the weights are {list(reference)}")
            array = np.asarray(value)
            if array.shape != reference[name].shape:
                expected = list(reference[name].shape)
                raise ValueError(f"set_state: {name!r} has shape {list(array.shape)}, but the weight is {expected}")
            updated[name] = array.astype(reference[name].dtype, copy=True)
        self.trained_coef_ = updated

    def get_trained_onnx(self, model: onnx.ModelProto | None = None) -> onnx.ModelProto:
        """A copy of ``model`` (default: ``model_onnx``) with the trained weights as its initializers.

        Pass the model without its loss to get a model that predicts.
        """
        target = self.model_onnx if model is None else model
        if not isinstance(target, onnx.ModelProto):
            raise TypeError(f"get_trained_onnx takes an onnx.ModelProto, not {type(target).__name__}")
        trained = self.get_state()
        copy = onnx.ModelProto()
        copy.CopyFrom(target)
        for tensor in copy.graph.initializer:
            if tensor.name in trained:
                expected = dtypes.to_numpy_dtype(tensor.data_type)
                replacement = numpy_helper.from_array(trained[tensor.name].astype(expected), tensor.name)
                tensor.CopyFrom(replacement)
        return copy

    # ----------------------------------------------------------------- fit

    def fit(
        self,
        X: Any,
        y: Any,
        sample_weight: Any = None,
        X_val: Any = None,
        y_val: Any = None,
        use_numpy: bool = False,
    ) -> OrtGradientOptimizer:
        """Train for ``max_iter`` iterations (fewer with early stopping); returns ``self``.

        ``X`` feeds the first input, ``y`` the label (reshaped to its rank),
        ``sample_weight`` the weight input (ones when the model has one and it
        is not given); arrays are cast to the inputs' types. ``use_numpy`` is
        accepted for onnxcustom's sake and changes nothing.
        """
        del use_numpy
        self._check_params()
        comm = self._communicator()
        model = self.model_onnx
        inputs = self._inputs()
        seed = _seed(self.random_state)
        seed = seed if comm is None else comm.bcast(np.random.SeedSequence(seed).entropy)
        rng = np.random.default_rng(seed)
        data = self._arrays(inputs, X, y, sample_weight, "X", "y")
        validation = None
        if (X_val is None) != (y_val is None):
            raise ValueError("fit: pass both X_val and y_val, or neither")
        if X_val is not None:
            validation = self._arrays(inputs, X_val, y_val, None, "X_val", "y_val", "fit's validation data")
        elif self.early_stopping:
            data, validation = _split(data, self.validation_fraction, rng)
        learning_rate = BaseLearningRate.select(self.learning_rate)
        block = self._optimizer_block(learning_rate)
        try:
            weights = self._weights_to_train()
            built = build_artifacts(
                model,
                weights,
                loss=_PerRow(inputs.features.name),
                optimizer=block,
                loss_input_names=[self.loss_output_name],
            )
        except (MissingGradientError, ValueError, TypeError) as error:
            raise type(error)(with_converter_hints(str(error), model)) from error
        if self.saved_gradient is not None:
            onnx.save_model(built.training_model, os.fspath(self.saved_gradient))

        state = TrainingState(built.checkpoint)
        start = self._start_weights(built.checkpoint.trainable, rng)
        for name, array in start.items():
            state.parameters[name] = array
        options = None if comm is None else distributed.session_options(comm)  # the cores shared among the ranks
        module = Module(
            built.training_model, state, built.eval_model, device=self.device, session_options=options, seed=seed
        )  # random draws (Dropout) from random_state too
        _check_labels(module, data, "fit")  # every row before shuffling: errors name the caller's row
        if validation is not None:
            _check_labels(module, validation, "fit's validation data")
        optimizer: Any = Optimizer(built.optimizer_model, module)
        if comm is not None:
            distributed.broadcast_parameters(state, comm=comm)
            optimizer = distributed.DistributedOptimizer(optimizer, comm)  # the ranks' equal parts' mean
        self._loop(module, optimizer, state, learning_rate, data, validation, rng, comm)
        self.learning_rate_ = learning_rate
        return self

    def _loop(
        self,
        module: Module,
        optimizer: Optimizer,
        state: TrainingState,
        learning_rate: BaseLearningRate,
        data: list[np.ndarray],
        validation: list[np.ndarray] | None,
        rng: np.random.Generator,
        comm: Any = None,
    ) -> None:
        n = len(data[0])
        batch_size = self.batch_size if comm is None else self.batch_size // comm.Get_size()
        every = 1 if self.early_stopping else _validation_period(self.validation_every, self.max_iter)
        self.train_losses_: list[float] = []
        self.validation_losses_: list[float] | None = [] if validation is not None else None
        last_good = _snapshot(state)
        best: tuple[float, dict[str, np.ndarray]] | None = None
        stalled = 0
        learning_rate.init_learning_rate()
        with Progress(self.max_iter, "fit", enabled=self.verbose > 0, leave=True) as bar:
            for iteration in range(self.max_iter):
                order = rng.permutation(n)
                if comm is not None:  # this rank's part of every global batch
                    order = distributed.batch_shares(order, batch_size, comm=comm)
                shuffled = [array[order] for array in data]  # one gather per iteration
                eta = learning_rate.value
                rows = len(order)
                sizes = np.minimum(batch_size, rows - np.arange(0, rows, batch_size))
                # the whole iteration in one onnxruntime call (Module.train_epoch), the per-step loop's results
                rates = np.full(len(sizes), eta)
                batch_losses = module.train_epoch(optimizer, shuffled, None, batch_size, learning_rates=rates)
                total, seen = float(np.dot(batch_losses, sizes)), rows  # each batch's mean over its rows
                if comm is not None:  # the same figures on every rank
                    summed = sum_over_ranks([total, seen], comm)
                    total, seen = float(summed[0]), int(summed[1])
                diverged = first_non_finite(batch_losses, comm)  # and the same verdict
                if diverged is not None:
                    self._diverged(state, last_good)
                    raise ConvergenceError(
                        f"the loss became NaN or infinite ({diverged.loss}{diverged.where}) at iteration "
                        f"{iteration + 1} of {self.max_iter} (batch {diverged.batch + 1}) with learning rate "
                        f"{eta:.4g}: the weights are those after iteration {iteration}; "
                        + self._divergence_advice("lower the learning rate or scale the features")
                    )
                weights = _snapshot(state)
                if not all(np.isfinite(array).all() for array in weights.values()):
                    self._diverged(state, last_good)
                    raise ConvergenceError(
                        f"a weight became NaN or infinite at iteration {iteration + 1} of {self.max_iter} with "
                        f"learning rate {eta:.4g}: the weights are those after iteration {iteration}; "
                        + self._divergence_advice("lower the learning rate")
                    )
                last_good = weights
                self.train_losses_.append(total / seen)
                self.n_iter_ = iteration + 1
                learning_rate.update_learning_rate(iteration)
                line = f"iteration {iteration + 1}/{self.max_iter}: loss {total / seen:.6g}, learning rate {eta:.4g}"
                if validation is not None and self.validation_losses_ is not None and (iteration + 1) % every == 0:
                    value = _evaluate(module, validation)
                    self.validation_losses_.append(value)
                    line += f", validation loss {value:.6g}"
                    if self.early_stopping:
                        if best is None or value < best[0] - self.tol:
                            best, stalled = (value, weights), 0
                        else:
                            stalled += 1
                bar.update()
                bar.describe(f"loss={total / seen:.3g} lr={eta:.3g}")
                if self.verbose > 1:
                    bar.write(line)
                if self.early_stopping and stalled >= self.n_iter_no_change:
                    break
        self.trained_coef_ = last_good
        if best is not None:
            self.best_validation_loss_, self.trained_coef_ = best

    def _divergence_advice(self, otherwise: str) -> str:
        """What to do after a divergence: leave out the trained constants (when there are any), else ``otherwise``."""
        constants = not_weights(self.model_onnx, self._weights_to_train())
        if not constants:
            return otherwise
        redrawn = "" if self.warm_start else ", and warm_start=False drew them anew (zeros for vectors and scalars)"
        return (
            f"the likely cause is that weights_to_train holds {', '.join(map(repr, constants))}, which the graph "
            f"reads as constants, not as weights{redrawn}: leave them out of weights_to_train "
            "(trainable_weights(model) lists the weights)"
        )

    def _diverged(self, state: TrainingState, last_good: dict[str, np.ndarray]) -> None:
        """Put the weights of the last good iteration back, in the state and in ``trained_coef_``."""
        _restore(state, last_good)
        self.trained_coef_ = last_good

    # ------------------------------------------------------------ helpers

    def _communicator(self) -> Any:
        """``None``, or with ``distributed`` the MPI communicator (``batch_size`` checked against its size)."""
        if not self.distributed:
            return None
        return distributed.batch_communicator(self.batch_size, "batch_size={}")

    def _check_params(self) -> None:
        if not isinstance(self.model_onnx, onnx.ModelProto):
            raise TypeError(f"model_onnx must be an onnx.ModelProto, not {type(self.model_onnx).__name__}")
        _count("max_iter", self.max_iter)
        _count("batch_size", self.batch_size)
        _count("n_iter_no_change", self.n_iter_no_change)
        if not isinstance(self.verbose, numbers.Integral) or self.verbose < 0:
            raise ValueError(f"verbose must be an int >= 0, not {self.verbose!r}")
        if not isinstance(self.validation_every, numbers.Real) or not self.validation_every > 0:
            raise ValueError(
                f"validation_every must be > 0 (a fraction of max_iter below 1), not {self.validation_every!r}"
            )
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), not {self.validation_fraction!r}")
        if not self.tol >= 0:
            raise ValueError(f"tol must be >= 0, not {self.tol!r}")
        _seed(self.random_state, draw=False)
        outputs = [value.name for value in self.model_onnx.graph.output]
        if self.loss_output_name not in outputs:
            raise ValueError(
                f"loss_output_name={self.loss_output_name!r} is not an output of the model; its outputs are "
                f"{outputs} (add_loss_output adds one named 'loss')"
            )

    def _inputs(self) -> _Inputs:
        graph = self.model_onnx.graph
        initializers = {tensor.name for tensor in graph.initializer}
        user = [value for value in graph.input if value.name not in initializers]
        weight = next((value for value in user if value.name == self.sample_weight_name), None)
        others = [value for value in user if value is not weight]
        if len(others) != 2:
            raise ValueError(
                f"OrtGradientOptimizer trains models with two inputs, the features then the label "
                f"(and optionally the sample weight {self.sample_weight_name!r}); this one has "
                f"{[value.name for value in user]}"
            )
        return _Inputs(others[0], others[1], weight)

    def _arrays(
        self, inputs: _Inputs, X: Any, y: Any, sample_weight: Any, x_name: str, y_name: str, what: str = "fit"
    ) -> list[np.ndarray]:
        """The arrays to feed, in the model's input order, cast and reshaped to the inputs; ``ValueError`` for
        none, or for a NaN or an infinity (``what`` names the data in errors)."""
        features = _as_input(X, inputs.features, x_name)
        label = _as_input(y, inputs.label, y_name)
        if not len(features):
            raise ValueError(f"{what}: {x_name} has no rows")
        arrays = {inputs.features.name: features, inputs.label.name: label}
        if sample_weight is not None and inputs.weight is None:
            raise ValueError(
                f"fit got sample_weight, but the model has no input {self.sample_weight_name!r}: build it with "
                f"add_loss_output(..., weight_name={self.sample_weight_name!r}) or set sample_weight_name"
            )
        if inputs.weight is not None:
            weight_dtype = dtypes.to_numpy_dtype(inputs.weight.type.tensor_type.elem_type)
            weights = np.ones(len(features), weight_dtype) if sample_weight is None else sample_weight
            arrays[inputs.weight.name] = _as_input(weights, inputs.weight, "sample_weight")
        counts = {name: len(array) for name, array in arrays.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"fit: the arrays have different numbers of samples: {counts}")
        order = [value.name for value in self.model_onnx.graph.input if value.name in arrays]
        trained = what == "fit"  # not the validation data, nor score's
        check_finite_rows([arrays[name] for name in order], order, what, self.model_onnx, trained=trained)
        return [arrays[name] for name in order]

    def _optimizer_block(self, learning_rate: BaseLearningRate) -> optim.Optimizer:
        name = self.training_optimizer_name
        momentum = isinstance(learning_rate, LearningRateSGDNesterov)
        if isinstance(name, optim.Optimizer):
            block = name
        elif name in OPTIMIZER_NAMES:
            kind = OPTIMIZER_NAMES[name]
            if kind == "sgd":
                return (
                    optim.SGD(momentum=learning_rate.momentum, nesterov=learning_rate.nesterov)  # type: ignore[attr-defined]
                    if momentum
                    else optim.SGD()
                )
            block = optim.Adam() if kind == "adam" else optim.AdamW()
        else:
            raise ValueError(
                f"training_optimizer_name={name!r} is not an optimizer; choose one of {list(OPTIMIZER_NAMES)} "
                "or pass an onnxtrain.optim optimizer (e.g. onnxtrain.optim.SGD(momentum=0.9))"
            )
        if momentum:
            raise ValueError(
                f"learning_rate={learning_rate!r} sets SGD's momentum, but the optimizer is "
                f"{type(block).__name__}: use training_optimizer_name='SGDOptimizer', or LearningRateSGD"
            )
        return block

    def _weights_to_train(self) -> list[str]:
        """``weights_to_train`` as a list, checked to name float initializers of ``model_onnx``."""
        names = self.weights_to_train
        if isinstance(names, np.ndarray) and names.ndim == 1:
            names = names.tolist()
        if isinstance(names, str) or not isinstance(names, Sequence) or not names:
            raise TypeError(
                f"weights_to_train must be a non-empty list of initializer names, not {names!r}; "
                "trainable_weights(model) lists the initializers the model reads as weights"
            )
        floats = {t.name for t in self.model_onnx.graph.initializer if dtypes.is_float(t.data_type)}
        for name in names:
            if name not in floats:
                weights = trainable_weights(self.model_onnx)
                known = (
                    f"trainable_weights(model) lists its weights: {unknown_name_hint(name, weights)}"
                    if weights
                    else "the model reads no initializer as a weight (trainable_weights(model) is empty): a model "
                    "of trees or kernels has nothing to train"
                )
                raise ValueError(
                    f"weights_to_train names {name!r}, which is not a float initializer of the model; {known}"
                )
        return list(names)

    def _initial_weights(self) -> dict[str, np.ndarray]:
        """The model's own values of the weights to train."""
        wanted = set(self._weights_to_train())
        return {t.name: numpy_helper.to_array(t) for t in self.model_onnx.graph.initializer if t.name in wanted}

    def _start_weights(self, current: Mapping[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """The weights ``fit`` starts from (see ``warm_start``)."""
        if self.warm_start:
            earlier = getattr(self, "trained_coef_", None)
            return {} if earlier is None else {name: earlier[name] for name in current if name in earlier}
        return {name: _drawn(array, rng) for name, array in current.items()}


# ------------------------------------------------------------------ functions


def _same(value: Any, default: Any) -> bool:
    try:
        return bool(value == default)
    except Exception:
        return False


def _count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, not {value!r}")


def _seed(random_state: Any, *, draw: bool = True) -> int | None:
    """``random_state`` as the seed of a fit: ``None``, an int >= 0 (NumPy's too), or a seed drawn from a
    ``numpy.random.RandomState`` or ``Generator`` (so that successive fits differ, as in scikit-learn);
    ``draw=False`` only checks it."""
    if random_state is None:
        return None
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, (bool, np.bool_)):
        if random_state < 0:
            raise ValueError(f"random_state must be >= 0, not {random_state!r}")
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max)) if draw else None
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int64).max)) if draw else None
    raise TypeError(
        f"random_state must be None, an int >= 0, a numpy.random.RandomState or a numpy.random.Generator, "
        f"not {type(random_state).__name__}"
    )


def _check_labels(module: Module, data: Sequence[np.ndarray], what: str) -> None:
    """``module.check_labels``, its advice said in ``fit``'s terms (a class is its position in the classes), and
    ``module.check_ids``: before any shuffle, every row of the caller's data."""
    try:
        module.check_labels(data, what)
    except ValueError as error:
        raise ValueError(str(error).replace(LABEL_ADVICE, _CLASS_POSITIONS)) from None
    module.check_ids(data, what)  # and the ids an embedding looks up, each named at its row of X


#: How ``y`` names classes for a converted classifier's scores.
_CLASS_POSITIONS = (
    "y holds each row's class as its position in the converted classifier's classes_ (0 to C-1): encode the "
    "labels with numpy.searchsorted(classifier.classes_, y)"
)


def _validation_period(validation_every: float, max_iter: int) -> int:
    """Iterations between validations: ``validation_every``, or that fraction of ``max_iter``."""
    if validation_every < 1:
        return max(1, int(max_iter * validation_every))
    return int(validation_every)


def _as_input(value: Any, spec: onnx.ValueInfoProto, what: str) -> np.ndarray:
    """``value`` as an array of the input's element type, reshaped to its rank when only a unit axis differs."""
    tensor = spec.type.tensor_type
    dtype = dtypes.to_numpy_dtype(tensor.elem_type)
    if hasattr(value, "toarray") and not isinstance(value, np.ndarray):  # a SciPy sparse matrix
        sparse = type(value).__name__
        raise TypeError(f"{what} is a sparse {sparse}: pass {what}.toarray() (the model's inputs are dense)")
    array = np.asarray(as_numbers(value, what))
    if array.dtype.kind not in "biuf":
        hint = f"; {_CLASS_POSITIONS}" if array.dtype.kind in "USO" and what.startswith("y") else ""
        raise TypeError(f"{what} must hold numbers to feed input {spec.name!r}, not {array.dtype}{hint}")
    if dtype.kind in "iu" and array.dtype.kind == "f" and not np.array_equal(array, np.round(array)):
        if np.isnan(array).any():  # pd.NA of a nullable integer column, too
            raise ValueError(f"{what} feeds the integer input {spec.name!r} but holds NaN: drop or impute those rows")
        raise ValueError(f"{what} feeds the integer input {spec.name!r} but holds fractions")
    dims = (
        [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
        if tensor.HasField("shape")
        else None
    )
    if dims is not None:
        if array.ndim == len(dims) - 1 and dims[-1] == 1:  # y of shape [N] for a label [N, 1]
            array = array.reshape(*array.shape, 1)
        elif array.ndim == len(dims) + 1 and array.shape[-1] == 1:  # y of shape [N, 1] for a label [N]
            array = array.reshape(array.shape[:-1])
        if array.ndim != len(dims) or any(d is not None and d != n for d, n in zip(dims, array.shape, strict=True)):
            declared = ["?" if d is None else d for d in dims]
            raise ValueError(f"{what} has shape {list(array.shape)}, but input {spec.name!r} is {declared}")
    return np.ascontiguousarray(array, dtype=dtype)


def _split(
    data: list[np.ndarray], fraction: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A random ``fraction`` of the samples held out for validation."""
    n = len(data[0])
    held = max(1, round(n * fraction))
    if held >= n:
        raise ValueError(f"early stopping holds out {held} of {n} samples, which leaves none to train on")
    order = rng.permutation(n)
    return [a[order[held:]] for a in data], [a[order[:held]] for a in data]


def _names(inputs: _Inputs) -> set[str]:
    """The names of the inputs ``fit`` feeds."""
    return {value.name for value in (inputs.features, inputs.label, inputs.weight) if value is not None}


class _PerRow(Block):
    """``loss / N``: a loss summed over the batch as its mean over the ``N`` rows of input ``rows_of``
    (``Shape``, ``Gather`` of its first dimension, ``Cast``, ``Div``)."""

    def __init__(self, rows_of: str) -> None:
        super().__init__()
        self._rows_of = rows_of

    def build(self, loss: str) -> str:
        b = self.builder
        rows = dim_size(b, self._rows_of, 0)
        if b.elem_type(rows) != b.elem_type(loss):  # integer features (token ids), or another float type
            rows = b.add_node("Cast", [rows], hint="rows", to=b.elem_type(loss))[0]
        return b.add_node("Div", [loss, rows], hint="loss_per_row")[0]


def _evaluate(module: Module, data: list[np.ndarray]) -> float:
    """The loss per sample of ``data`` in eval mode (the eval model's loss is the mean over a run's rows)."""
    module.eval()
    try:
        n = len(data[0])
        total = 0.0
        for start in range(0, n, VALIDATION_CHUNK):
            chunk = [array[start : start + VALIDATION_CHUNK] for array in data]
            total += float(np.asarray(module(*chunk))) * len(chunk[0])
        return total / n
    finally:
        module.train()


def _drawn(array: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A new value for a weight: Glorot-uniform for matrices and kernels, zeros for vectors and scalars."""
    if array.ndim < 2:
        return np.zeros_like(array)
    receptive = math.prod(array.shape[2:])
    bound = math.sqrt(6.0 / ((array.shape[0] + array.shape[1]) * receptive))
    return rng.uniform(-bound, bound, size=array.shape).astype(array.dtype)


def _snapshot(state: TrainingState) -> dict[str, np.ndarray]:
    """Copies of the trainable parameters."""
    return {name: parameter.data for name, parameter in state.parameters if parameter.requires_grad}


def _restore(state: TrainingState, weights: Mapping[str, np.ndarray]) -> None:
    for name, array in weights.items():
        state.parameters[name] = array


__all__ = ["OPTIMIZER_NAMES", "ConvergenceError", "OrtGradientOptimizer"]
