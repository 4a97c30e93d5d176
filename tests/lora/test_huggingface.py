"""LoRA on transformers' DistilBERT as torch exports it three ways, targeted by module name: ``["q_lin", "v_lin"]``.

On each export (:mod:`tests.lora.huggingface`: TorchScript's ``MatMul(x, Transpose(W))``,
its constant-folded ``MatMul(x, onnx::MatMul_<n>)``, dynamo's ``MatMul(x, val_<n>)``)
the adapters go beside the query and value projections of both layers and
nothing else, the adapted model starts equal to the base, the adapters'
gradients equal torch's for ``W + (alpha / rank) (A B)^T``, and the merged model
gives the trained model's outputs with the base's nodes (the ``Transpose``
kept, the update folded into the untransposed weight).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain.artifacts.training_model import set_inference_mode
from onnxtrain.lora import adapters_of, add_adapters, merge_adapters
from tests.lora.helpers import ALPHA, RANK, fine_tune, generate, inference_op_types, run, trained_values, with_values
from tests.lora.huggingface import ADAPTED, EXPORTS, Export, exported, torch_loss_and_gradients, torch_names
from tests.transformers import models

pytest.importorskip("torch")
pytest.importorskip("transformers")

TARGETS = ["q_lin", "v_lin"]


def _data(seed: int, length: int = 7) -> dict[str, np.ndarray]:
    return models.batch("distilbert", np.random.default_rng(seed), length, size=4)


@pytest.mark.parametrize("how", EXPORTS)
def test_targets_by_module_name_on_each_export(how: Export) -> None:
    model = exported(how)
    adapted, names = add_adapters(model, TARGETS, RANK, ALPHA)
    records = adapters_of(adapted)
    assert names == [name for r in records for name in (r.a, r.b)]
    assert sorted(torch_names(adapted, {r.weight: r.transposed for r in records}).values()) == sorted(ADAPTED)
    assert {r.transposed for r in records} == {how == "torchscript"}, "only TorchScript's unfolded export transposes"
    assert {r.kind for r in records} == {"MatMul"}
    ids = _data(0)["ids"]
    np.testing.assert_allclose(run(adapted, {"ids": ids})[0], run(model, {"ids": ids})[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("how", EXPORTS)
def test_adapter_gradients_match_torch(how: Export, tmp_path: Path) -> None:
    adapted, names = add_adapters(exported(how), TARGETS, RANK, ALPHA)
    records = adapters_of(adapted)
    rng = np.random.default_rng(1)
    shapes = {t.name: list(t.dims) for t in adapted.graph.initializer}
    values = {name: rng.normal(0.0, 0.3, size=shapes[name]).astype(np.float32) for name in names}
    folder = generate(with_values(adapted, values), names, tmp_path)
    training = onnx.load(folder / "training_model.onnx")
    data = _data(2)
    feeds = {"ids": data["ids"], "labels": data["labels"], **values, "lazy_reset_grad": np.array([True])}
    feeds.update({f"{name}_grad.accumulation.buffer": np.zeros_like(v) for name, v in values.items()})
    outputs = dict(zip([o.name for o in training.graph.output], run(training, feeds, optimized=False), strict=True))
    to_torch = torch_names(adapted, {r.weight: r.transposed for r in records})
    adapters = {to_torch[r.weight]: (values[r.a], values[r.b]) for r in records}
    loss, expected = torch_loss_and_gradients(adapters, ALPHA / RANK, data)
    assert float(outputs[training.graph.output[0].name]) == pytest.approx(loss, rel=1e-5)
    for r in records:
        for name, want in zip((r.a, r.b), expected[to_torch[r.weight]], strict=True):
            got = outputs[f"{name}_grad.accumulation.out"]
            assert np.abs(want).max() > 1e-4, f"the gradient of {name} is zero: the check would be empty"
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5 * float(np.abs(want).max()), err_msg=name)


@pytest.mark.parametrize("how", EXPORTS)
def test_trained_adapters_merge_into_the_base(how: Export, tmp_path: Path) -> None:
    model = exported(how)
    adapted, names = add_adapters(model, TARGETS, RANK, ALPHA)
    folder = generate(adapted, names, tmp_path)
    data = _data(3)
    losses, state = fine_tune(folder, data["ids"], data["labels"], 10, learning_rate=5e-2)
    assert losses[-1] < 0.9 * losses[0]  # 1.093 to 0.940, the same on the three exports
    trained = with_values(adapted, trained_values(state, names))
    set_inference_mode(trained)
    ids = _data(4, length=11)["ids"]
    (expected,) = run(trained, {"ids": ids})

    merged = merge_adapters(adapted, state)
    (got,) = run(merged, {"ids": ids})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert [n.op_type for n in merged.graph.node] == inference_op_types(model)
    assert [t.name for t in merged.graph.initializer] == [t.name for t in model.graph.initializer]
    onnx.checker.check_model(merged)
