"""An empty batch (a slice past the end of the data) is refused, not trained on.

Before, ``module(x[300:332], y[300:332])`` on 256 rows returned the loss 0.0
(onnxruntime's mean over no rows; torch's is nan), and the optimizer stepped on
zero gradients: an indexing bug in the loop went unnoticed. The data input (the
first whose shape the model does not fix) may not be empty along a dimension
the model leaves open; other inputs may (ragged data), and so may a dimension
the model fixes at 0.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxtrain.training.inputs import UserInputs
from onnxtrain.training.tensor_spec import TensorSpec
from tests.training.helpers import open_module, regression_batch, snapshot

PAST_THE_END = r"input 'x' of the training model holds 0 rows \(batch = 0\): a slice past the end of the data\?"


def _inputs(*specs: tuple[str, tuple[int | str | None, ...] | None], model: str = "training model") -> UserInputs:
    return UserInputs([TensorSpec(name, np.dtype(np.float32), dims) for name, dims in specs], model)


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def test_a_train_step_on_no_rows_raises_and_changes_nothing(regression, rng) -> None:
    state, module, optimizer = open_module(regression)
    x, target = regression_batch(rng)
    module(x, target)
    optimizer.step()
    module.lazy_reset_grad()
    module(x, target)  # the same signature again: the check is skipped for it, not for the empty batch
    before, steps = snapshot(state), module.train_step_count
    with pytest.raises(ValueError, match=PAST_THE_END + ".*pass at least one row"):
        module(x[len(x) :], target[len(x) :])
    with pytest.raises(ValueError, match=PAST_THE_END):
        module(ort.OrtValue.ortvalue_from_numpy(x[:0]), ort.OrtValue.ortvalue_from_numpy(target[:0]))
    with pytest.raises(ValueError, match=PAST_THE_END):
        module.train_step(x=x[:0], target=target[:0])
    after = snapshot(state)
    assert module.train_step_count == steps and after.keys() == before.keys()
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_an_eval_step_on_no_rows_raises_as_well(regression, rng) -> None:
    """torch's mean over no rows is nan; onnxruntime's eval loss was 0.0, which an average over batches takes in."""
    _state, module, _ = open_module(regression, optimizer=False)
    x, target = regression_batch(rng)
    module.eval()
    module(x, target)
    with pytest.raises(ValueError, match=r"input 'x' of the eval model holds 0 rows \(batch = 0\)"):
        module(x[:0], target[:0])


def test_train_epoch_on_no_rows_raises(regression, rng) -> None:
    state, module, optimizer = open_module(regression)
    x, target = regression_batch(rng)
    before = snapshot(state)
    with pytest.raises(ValueError, match=r"train_epoch: input 'x' holds 0 rows: a slice past the end of the data\?"):
        module.train_epoch(optimizer, x[8:], target[8:], 4)
    after = snapshot(state)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_only_the_data_input_along_an_open_dimension_is_refused() -> None:
    # a scalar and a fixed input first: the data input is the first whose shape the model leaves open
    inputs = _inputs(("scale", ()), ("bias", (3,)), ("x", ("batch", 4)), ("labels", ("batch",)))
    inputs.collect([np.array(2.0, np.float32), _zeros(3), _zeros(5, 4), _zeros(5)], {})
    with pytest.raises(ValueError, match=r"input 'x' of the training model holds 0 rows \(batch = 0\)"):
        inputs.collect([np.array(2.0, np.float32), _zeros(3), _zeros(0, 4), _zeros(0)], {})
    # a later input may be empty (the boxes of an image without any), the data input not
    ragged = _inputs(("images", ("batch", 4)), ("boxes", ("boxes", 4)))
    ragged.collect([_zeros(2, 4), _zeros(0, 4)], {})
    with pytest.raises(ValueError, match=r"'images' of the training model holds 0 rows"):
        ragged.collect([_zeros(0, 4), _zeros(3, 4)], {})
    # a dimension the model fixes at 0 is the model's own
    fixed = _inputs(("x", ("batch", 0)))
    fixed.collect([_zeros(4, 0)], {})
    with pytest.raises(ValueError, match=r"holds 0 rows \(batch = 0\)"):
        fixed.collect([_zeros(0, 0)], {})
    # every dimension fixed: no data input, nothing refused
    assert _inputs(("x", (0, 4))).collect([_zeros(0, 4)], {})[0].shape == (0, 4)


def test_an_open_dimension_past_the_first_and_unknown_ones() -> None:
    sequences = _inputs(("tokens", (4, "seq")), model="eval model")
    sequences.collect([_zeros(4, 7)], {})
    with pytest.raises(
        ValueError, match=r"'tokens' of the eval model holds no values \(shape \[4, 0\]: seq = 0, axis 1\)"
    ):
        sequences.collect([_zeros(4, 0)], {})
    one_axis = _inputs(("tokens", ("seq",)))  # a [seq] input: its one axis is its rows
    one_axis.collect([_zeros(3)], {})
    with pytest.raises(ValueError, match=r"holds 0 rows \(seq = 0\)"):
        one_axis.collect([_zeros(0)], {})
    unknown = _inputs(("x", (None, 4)))  # a dimension without a name
    with pytest.raises(ValueError, match=r"holds 0 rows \(axis 0 is 0\)"):
        unknown.collect([_zeros(0, 4)], {})
    any_rank = _inputs(("x", None))
    any_rank.collect([np.array(1.0, np.float32)], {})
    with pytest.raises(ValueError, match=r"holds no values \(shape \[2, 0\]: axis 1 is 0\)"):
        any_rank.collect([_zeros(2, 0)], {})


def test_the_tensor_spec_of_a_model_input_reads_its_open_dimensions() -> None:
    """The rule reads what ``TensorSpec.of`` gives: a dim_param is a name, a dimension with neither is ``None``."""
    value = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", None, 4])
    inputs = UserInputs([TensorSpec.of(value, "training model")], "training model")
    inputs.collect([_zeros(2, 3, 4)], {})
    with pytest.raises(ValueError, match=r"shape \[2, 0, 4\]: axis 1 is 0"):
        inputs.collect([_zeros(2, 0, 4)], {})
