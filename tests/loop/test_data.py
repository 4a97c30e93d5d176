"""Arrays from .npz and .csv files, cast and shaped for the training model's inputs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxtrain.loop import fit_to_inputs, load_data
from onnxtrain.loop.data import UnusedDataWarning
from onnxtrain.training.tensor_spec import TensorSpec

X = TensorSpec("pixels", np.dtype(np.float32), ("batch", 3))
LABELS = TensorSpec("labels", np.dtype(np.int64), ("batch",))
TARGET = TensorSpec("target", np.dtype(np.float32), ("batch", 1))


def test_npz_arrays_named_after_the_inputs(tmp_path: Path):
    np.savez(tmp_path / "d.npz", labels=np.array([1, 0]), pixels=np.ones((2, 3)), extra=np.zeros(1))
    with pytest.warns(UnusedDataWarning, match="'extra'"):
        pixels, labels = load_data(tmp_path / "d.npz", [X, LABELS])
    assert (pixels.dtype, pixels.shape, labels.dtype) == (np.float32, (2, 3), np.int64)


@pytest.mark.parametrize("name", ["X", "x"])
def test_npz_x_and_y(tmp_path: Path, name: str):
    np.savez(tmp_path / "d.npz", **{name: np.ones((2, 3)), "y": np.array([0.0, 1.0])})
    _, labels = load_data(tmp_path / "d.npz", [X, LABELS])
    assert labels.tolist() == [0, 1] and labels.dtype == np.int64


def test_npz_arrays_no_input_takes_are_said_to_be_left_out(tmp_path: Path):
    """A tokenizer's ``token_type_ids`` beside the inputs' arrays: a warning names it; the others are used."""
    x, labels = np.zeros((4, 3), np.float32), np.arange(4)
    np.savez(tmp_path / "d.npz", pixels=x, labels=labels, token_type_ids=np.zeros((4, 3), np.int64))
    with pytest.warns(UnusedDataWarning, match=r"d.npz holds arrays \['token_type_ids'\] that no input"):
        arrays = load_data(tmp_path / "d.npz", [X, LABELS])
    np.testing.assert_array_equal(arrays[1], labels)


def test_the_target_takes_the_inputs_rank():
    _, target = fit_to_inputs([("a", np.ones((4, 3))), ("b", np.arange(4.0))], [X, TARGET], "data")
    assert target.shape == (4, 1) and target.dtype == np.float32
    _, labels = fit_to_inputs([("a", np.ones((4, 3))), ("b", np.arange(4).reshape(4, 1))], [X, LABELS], "data")
    assert labels.shape == (4,)


def test_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match=r"array 'a' \(for input 'pixels', float32\[batch, 3\]\): shape \[4, 5\]"):
        fit_to_inputs([("array 'a'", np.ones((4, 5))), ("b", np.arange(4))], [X, LABELS], "data")


def test_casts_that_lose_values():
    with pytest.raises(TypeError, match=r"0\.5, which is not a whole number"):
        fit_to_inputs([("a", np.ones((2, 3))), ("b", np.array([0.5, 1.0]))], [X, LABELS], "data")
    with pytest.raises(TypeError, match="cannot be cast"):
        fit_to_inputs([("a", np.array([["a", "b", "c"]])), ("b", np.array([1]))], [X, LABELS], "data")
    small = TensorSpec("k", np.dtype(np.uint8), ("batch",))
    with pytest.raises(TypeError, match="outside the range of uint8"):
        fit_to_inputs([("a", np.array([300, 1]))], [small], "data")


def test_csv_with_header_and_a_target_column(tmp_path: Path):
    (tmp_path / "d.csv").write_text("label,a,b,c\n1,0.5,1.5,2.5\n0,1,2,3\n")
    pixels, labels = load_data(tmp_path / "d.csv", [X, LABELS], target_column="label")
    assert pixels.tolist() == [[0.5, 1.5, 2.5], [1, 2, 3]] and labels.tolist() == [1, 0]
    pixels, labels = load_data(tmp_path / "d.csv", [X, LABELS], target_column="-4")
    assert labels.tolist() == [1, 0]


def test_csv_targets_of_several_values_per_sample_take_as_many_columns(tmp_path: Path):
    """A regression of 3 outputs (target [batch, 3]): the last 3 columns, or the 3 --target-column names; a .csv
    fed only one target column to a [batch, 3] target, and said nothing of it."""
    three = TensorSpec("target", np.dtype(np.float32), ("batch", 3))
    two = TensorSpec("x", np.dtype(np.float32), ("batch", 2))
    (tmp_path / "d.csv").write_text("t0,a,b,t1,t2\n1,2,3,4,5\n6,7,8,9,10\n11,12,13,14,15\n")
    x, target = load_data(tmp_path / "d.csv", [two, three])
    assert x.tolist() == [[1, 2], [6, 7], [11, 12]] and target.tolist() == [[3, 4, 5], [8, 9, 10], [13, 14, 15]]
    x, target = load_data(tmp_path / "d.csv", [two, three], target_column=["t0", "t1", "t2"])
    assert x.tolist() == [[2, 3], [7, 8], [12, 13]] and target.tolist() == [[1, 4, 5], [6, 9, 10], [11, 14, 15]]
    with pytest.raises(ValueError, match=r"the target columns \['t0', 't1'\] .*does not fit"):
        load_data(tmp_path / "d.csv", [TensorSpec("x", np.dtype(np.float32), ("batch", 3)), three],
                  target_column=["t0", "t1"])  # fmt: skip
    (tmp_path / "narrow.csv").write_text("1,2,3\n")
    with pytest.raises(ValueError, match=r"has 3 column\(s\); it needs feature columns and 3 target column\(s\)"):
        load_data(tmp_path / "narrow.csv", [two, three])


def test_csv_errors(tmp_path: Path):
    (tmp_path / "d.csv").write_text("1,2,3,4\n5,6,x,8\n")
    with pytest.raises(ValueError, match=r"d.csv, line 2: 'x' is not a number"):
        load_data(tmp_path / "d.csv", [X, LABELS])
    (tmp_path / "e.csv").write_text("1,2,3,4\n5,6\n")
    with pytest.raises(ValueError, match="line 2: 2 columns"):
        load_data(tmp_path / "e.csv", [X, LABELS])
    (tmp_path / "f.csv").write_text("")
    with pytest.raises(ValueError, match="empty"):
        load_data(tmp_path / "f.csv", [X, LABELS])


def test_unknown_formats_and_misplaced_options(tmp_path: Path):
    (tmp_path / "d.txt").write_text("1")
    with pytest.raises(ValueError, match=r"unknown data format '\.txt'"):
        load_data(tmp_path / "d.txt", [X, LABELS])
    np.savez(tmp_path / "d.npz", X=np.ones((2, 3)), y=np.ones(2))
    with pytest.raises(ValueError, match=r"applies to \.csv"):
        load_data(tmp_path / "d.npz", [X, LABELS], target_column="y")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"bad.npz is not an \.npz archive .*numpy.savez"):
        load_data(tmp_path / "bad.npz", [X, LABELS])


IMAGES = TensorSpec("images", np.dtype(np.float32), ("batch", 3, 32, 32))


def test_channels_last_images_for_a_channels_first_input_say_how_to_transpose():
    nhwc = np.zeros((256, 32, 32, 3), np.float32)
    with pytest.raises(ValueError, match=r": shape \[256, 32, 32, 3\]") as raised:
        fit_to_inputs([("array 'X'", nhwc)], [IMAGES], "data.npz")
    message = str(raised.value)
    assert "[3, 32, 32] per sample" in message and "channels last (NHWC)" in message
    assert "channels first (NCHW)" in message and "numpy.transpose(X, (0, 3, 1, 2))" in message
    nchw = np.zeros((4, 3, 32, 32), np.float32)
    channels_last = TensorSpec("images", np.dtype(np.float32), ("batch", 32, 32, 3))
    with pytest.raises(ValueError, match=r"channels first \(NCHW\) .* numpy\.transpose\(X, \(0, 2, 3, 1\)\)"):
        fit_to_inputs([("array 'X'", nchw)], [channels_last], "data.npz")


def test_axes_in_another_order():
    sequences = TensorSpec("tokens", np.dtype(np.float32), ("batch", 5, 7))
    with pytest.raises(ValueError, match=r"\[5, 7\] per sample.*another order.*numpy\.transpose\(x, \(0, 2, 1\)\)"):
        fit_to_inputs([("array 'x'", np.zeros((2, 7, 5)))], [sequences], "data.npz")


def test_flat_rows_are_reshaped_only_when_asked():
    flat = np.arange(2 * 3072, dtype=np.float32).reshape(2, 3072)
    with pytest.raises(ValueError, match=r": shape \[2, 3072\]") as raised:
        fit_to_inputs([("the columns", flat)], [IMAGES], "data.csv")
    message = str(raised.value)
    assert "[3, 32, 32] per sample" in message and "--reshape" in message and "C order" in message
    (images,) = fit_to_inputs([("the columns", flat)], [IMAGES], "data.csv", reshape=True)
    np.testing.assert_array_equal(images, flat.reshape(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"3,000 values per sample.*\[3, 32, 32\] holds 3,072"):
        fit_to_inputs([("the columns", flat[:, :3000])], [IMAGES], "data.csv", reshape=True)


def test_reshape_sizes_one_symbolic_per_sample_axis_as_numpys_minus_one():
    """x: [batch, 2, time] from rows of 96 values: time = 48. It was refused, even with --reshape, telling the user
    to give one row per sample, which the file did."""
    series = TensorSpec("x", np.dtype(np.float32), ("batch", 2, "time"))
    flat = np.arange(3 * 96, dtype=np.float32).reshape(3, 96)
    with pytest.raises(ValueError, match=r"\[2, time\] per sample; each row holds its 96 values: pass --reshape to "
                       r"reshape each row to \[2, 48\] \(time = 48\) in C order") as raised:  # fmt: skip
        fit_to_inputs([("the feature columns", flat)], [series], "data.csv")
    assert "one row of the input per sample" not in str(raised.value)
    (x,) = fit_to_inputs([("the feature columns", flat)], [series], "data.csv", reshape=True)
    np.testing.assert_array_equal(x, flat.reshape(3, 2, 48))
    with pytest.raises(ValueError, match=r"each row holds 95 values, which .* \(2 values for each time\) do not"):
        fit_to_inputs([("the feature columns", flat[:, :95])], [series], "data.csv", reshape=True)
    grid = TensorSpec("x", np.dtype(np.float32), ("batch", "height", 3, "width"))
    for reshape in (False, True):
        with pytest.raises(ValueError, match=r"--reshape fills at most one unknown per-sample dimension, and "
                           r"\[height, 3, width\] has 2 \(height, width\): .* in an \.npz"):  # fmt: skip
            fit_to_inputs([("the feature columns", flat)], [grid], "data.csv", reshape=reshape)


def test_reshape_leaves_arrays_of_several_axes_alone():
    """--reshape reshapes rows of values; an array with axes of its own would be scrambled, so it stays an error."""
    with pytest.raises(ValueError, match="channels last"):
        fit_to_inputs([("array 'X'", np.zeros((2, 32, 32, 3), np.float32))], [IMAGES], "data.npz", reshape=True)


def test_axes_of_size_one_are_added_or_removed_without_asking():
    column = TensorSpec("y", np.dtype(np.float32), ("batch", 1))
    (target,) = fit_to_inputs([("b", np.arange(4.0).reshape(4, 1, 1))], [column], "data")
    assert target.shape == (4, 1)
    image = TensorSpec("image", np.dtype(np.float32), ("batch", 1, 2, 2))
    (gray,) = fit_to_inputs([("a", np.zeros((3, 2, 2)))], [image], "data")
    assert gray.shape == (3, 1, 2, 2)


def test_one_hot_labels_are_told_to_take_the_argmax():
    """Float one-hot rows for int64 labels are whole numbers, so they cast; the message must say what fixes them."""
    labels = np.eye(5, dtype=np.float32)[[0, 3, 1]]
    with pytest.raises(ValueError, match=r"one column per class.*save y\.argmax\(axis=-1\) instead"):
        fit_to_inputs([("array 'X'", np.zeros((3, 3), np.float32)), ("array 'y'", labels)], [X, LABELS], "data.npz")
    _, y = fit_to_inputs(
        [("array 'X'", np.zeros((3, 3), np.float32)), ("array 'y'", labels.argmax(-1))], [X, LABELS], "d"
    )
    assert y.tolist() == [0, 3, 1]


def test_npz_arrays_named_after_some_inputs_and_y_for_the_target(tmp_path: Path):
    """A model of three inputs (ids, a mask, the labels): two arrays under the inputs' names and ``y``."""
    ids = TensorSpec("input_ids", np.dtype(np.int64), ("batch", 4))
    mask = TensorSpec("attention_mask", np.dtype(np.int64), ("batch", 4))
    np.savez(tmp_path / "d.npz", input_ids=np.ones((3, 4)), attention_mask=np.ones((3, 4)), y=np.array([0, 1, 2]))
    _, _, labels = load_data(tmp_path / "d.npz", [ids, mask, LABELS])
    assert labels.tolist() == [0, 1, 2]
    np.savez(tmp_path / "e.npz", input_ids=np.ones((3, 4)), y=np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"no array for input 'attention_mask'; name the arrays after these inputs"):
        load_data(tmp_path / "e.npz", [ids, mask, LABELS])
