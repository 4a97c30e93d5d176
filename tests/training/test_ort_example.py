"""Code written for ONNX Runtime's training API runs with only its import changed."""

from __future__ import annotations

import numpy as np

# ONNX Runtime's on-device training example (Python), as its documentation writes it,
# plus the rest of the API: a scheduler, parameters, properties, buffers and export.
ORT_EXAMPLE = """
from onnxruntime.training.api import CheckpointState, Module, Optimizer, LinearLRScheduler

state = CheckpointState.load_checkpoint(checkpoint_path)
module = Module(training_model_path, state, eval_model_path, device="cpu")
optimizer = Optimizer(optimizer_model_path, module)
scheduler = LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=20, initial_lr=0.05)

for epoch in range(4):
    module.train()
    for inputs, labels in batches:
        training_loss = module(inputs, labels)
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
    module.eval()
    eval_loss = module(eval_inputs, eval_labels)
    eval_losses.append(float(eval_loss))

state.properties["epoch"] = epoch
weights = state.parameters["fc0.weight"].data
buffer = module.get_contiguous_parameters(trainable_only=True).numpy()
module.copy_buffer_to_parameters(module.get_contiguous_parameters(trainable_only=True))
assert module.get_parameters_size(trainable_only=True) == buffer.size
print(module.input_names(), module.output_names(), optimizer.get_learning_rate())

CheckpointState.save_checkpoint(state, saved_checkpoint_path)
module.export_model_for_inferencing(inference_model_path, [output_name])
"""


def test_the_ort_example_runs_with_only_the_import_changed(classifier, tmp_path, capsys):
    code = ORT_EXAMPLE.replace("from onnxruntime.training.api import", "from onnxtrain.api import")
    assert code.count("\n") == ORT_EXAMPLE.count("\n") and code != ORT_EXAMPLE
    rng = np.random.default_rng(0)

    def batch(n):
        x = rng.normal(size=(n, 6)).astype(np.float32)
        return x, np.argmax(x[:, :4], axis=1).astype(np.int64)

    eval_inputs, eval_labels = batch(64)
    namespace = {
        "checkpoint_path": str(classifier["checkpoint"]),
        "training_model_path": str(classifier["training_model"]),
        "eval_model_path": str(classifier["eval_model"]),
        "optimizer_model_path": str(classifier["optimizer_model"]),
        "saved_checkpoint_path": str(tmp_path / "checkpoint"),
        "inference_model_path": str(tmp_path / "inference.onnx"),
        "output_name": "y",
        "batches": [batch(16) for _ in range(5)],
        "eval_inputs": eval_inputs,
        "eval_labels": eval_labels,
        "eval_losses": [],
    }
    exec(compile(code, "ort_example", "exec"), namespace)
    losses = namespace["eval_losses"]
    assert losses[-1] < losses[0]
    assert (tmp_path / "checkpoint").exists() and (tmp_path / "inference.onnx").exists()
    assert "['x', 'labels'] ['" in capsys.readouterr().out
