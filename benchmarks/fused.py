"""An experiment for the runtime, not a feature: the training and optimizer models merged into one graph.

:func:`fuse` feeds the optimizer's ``<p>_grad`` inputs from the training
model (its accumulated gradients, or with ``accumulate=False`` the raw
gradients, the accumulation pruned away) so that one onnxruntime run does a
whole training step. :mod:`benchmarks.profile_step` times it against the two
separate sessions, to size what a fused train-and-update path would gain.
"""

from __future__ import annotations

import onnx

PREFIX = "optimizer/"


def fuse(training: onnx.ModelProto, optimizer: onnx.ModelProto, *, accumulate: bool) -> onnx.ModelProto:
    """One model: inputs of both (shared parameters once), outputs the loss and the optimizer's outputs."""
    graph = onnx.GraphProto()
    graph.CopyFrom(training.graph)
    graph.name = "fused_training_step"
    optimizer_outputs = {o.name for o in optimizer.graph.output}
    grads = [i.name for i in optimizer.graph.input if i.name.endswith("_grad")]
    rename = {t.name: PREFIX + t.name for t in optimizer.graph.initializer}
    rename.update(
        {name: PREFIX + name for node in optimizer.graph.node for name in node.output if name not in optimizer_outputs}
    )
    for grad in grads:
        rename[grad] = f"{grad[: -len('_grad')]}_grad.accumulation.out" if accumulate else grad
    for node in optimizer.graph.node:
        copy = graph.node.add()
        copy.CopyFrom(node)
        copy.input[:] = [rename.get(name, name) for name in node.input]
        copy.output[:] = [rename.get(name, name) for name in node.output]
        copy.name = PREFIX + node.name if node.name else ""
    for tensor in optimizer.graph.initializer:
        copy_tensor = graph.initializer.add()
        copy_tensor.CopyFrom(tensor)
        copy_tensor.name = rename[tensor.name]
    present = {i.name for i in graph.input}
    graph.input.extend(i for i in optimizer.graph.input if i.name not in present and i.name not in grads)
    loss = onnx.ValueInfoProto()
    loss.CopyFrom(graph.output[0])
    del graph.output[:]
    graph.output.extend([loss, *optimizer.graph.output])
    if not accumulate:
        _prune(graph)
    model = onnx.helper.make_model(graph, opset_imports=training.opset_import)
    model.ir_version = training.ir_version
    onnx.checker.check_model(model)
    return model


def _prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes, inputs and initializers that no output needs."""
    needed = {o.name for o in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
    nodes = list(reversed(kept))
    inputs = [i for i in graph.input if i.name in needed]
    initializers = [t for t in graph.initializer if t.name in needed]
    del graph.node[:], graph.input[:], graph.initializer[:]
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    graph.initializer.extend(initializers)
