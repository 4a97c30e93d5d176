"""Transformers after ONNX Runtime's transformer optimizer train with torch's gradients.

The exports of :mod:`tests.transformers.models` go through
``onnxruntime.transformers.optimizer.optimize_model`` (CPU, float32), which
fuses subgraphs into ONNX Runtime's own operators. Each variant below records
the fused operators its model must contain (asserted, so that the gradient
test really covers them). The fusions rename and merge parameters, so the
gradient with respect to each fused initializer is mapped back onto torch's
parameters (:mod:`tests.transformers.fused`): the sum for every torch
parameter must equal torch autograd's gradient, at two sequence lengths.

What ONNX Runtime 1.32's optimizer does to these TorchScript exports of
transformers 5 (the variants record it):

- BERT (``model_type="bert"``, ``opt_level=1``): EmbedLayerNormalization,
  Attention (packed QKV weight and bias), SkipLayerNormalization, BiasGelu;
  again without the embedding and bias-GELU fusions (``enable_embed_layer_norm``
  and ``enable_bias_gelu`` off: Gelu instead of BiasGelu), so that the
  attention is covered while EmbedLayerNormalization has no rule;
- DistilBERT (the same, ``use_multi_head_attention``): MultiHeadAttention
  instead of Attention, with and without the embedding fusion;
- GPT-2 (``"gpt2"``, ``opt_level=1``): SkipLayerNormalization and FastGelu; its
  attention is not fused;
- Llama (``"gpt2"``): ``opt_level=0`` fuses the RMSNorms into
  SkipSimplifiedLayerNormalization and SimplifiedLayerNormalization;
  ``opt_level=2`` (onnxruntime's own fusions) SiLU into QuickGelu and the
  RMSNorms into SimplifiedLayerNormalization. No level fuses its attention or
  rotary embeddings. SimplifiedLayerNormalization is written in the default
  domain (ONNX Runtime registers it there), though it is no ONNX operator.

onnxruntime 1.23.2 fuses no attention in these exports: the BERT and
DistilBERT variants skip on releases older than 1.32.

Before training, :func:`_prepared` types the fused operators' outputs with
ONNX Runtime's symbolic shape inference: onnxtrain types those of the
normalizations and GELUs itself (and imports ``com.microsoft``, which
``opt_level=0`` leaves out), but not those of the attention operators
(``test_the_optimizers_own_output_trains_without_preparation`` trains the
optimizer's own output where it has none). A variant whose fusions an older
onnxruntime does not make is skipped there, saying so.
"""

from __future__ import annotations

import collections
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxtrain.graph.passes.retie import transposed_copies
from tests.transformers import fused, models, train
from tests.transformers.models import LENGTHS

pytest.importorskip("torch")
pytest.importorskip("transformers")

MS = "com.microsoft"


@dataclass(frozen=True)
class Variant:
    """A model, the optimizer's arguments, and the fused operators it must write: ``(domain, op, count)``."""

    id: str
    model: str
    model_type: str
    opt_level: int
    fused: tuple[tuple[str, str, int], ...]
    options: tuple[str, ...] = ()  # FusionOptions flags set to True ("!flag": to False)
    symbolic_shapes: bool = True  # whether ONNX Runtime's symbolic shape inference succeeds on the optimized model
    since: tuple[int, int] = (1, 23)  # the oldest onnxruntime whose optimizer is known to make these fusions

    @property
    def expected(self) -> dict[tuple[str, str], int]:
        return {(domain, op): count for domain, op, count in self.fused}


#: onnxruntime 1.23.2 fuses no attention (nor the embedding) in these exports; 1.32 does. Releases between
#: were not tried: the attention variants skip on any release older than the one they were recorded with.
ATTENTION_SINCE = (1, 32)
EMBED = (MS, "EmbedLayerNormalization", 1)
SKIP_LN, BIAS_GELU = (MS, "SkipLayerNormalization", 4), (MS, "BiasGelu", 2)

VARIANTS = (
    Variant("bert", "bert", "bert", 1, (EMBED, (MS, "Attention", 2), SKIP_LN, BIAS_GELU), since=ATTENTION_SINCE),
    Variant(
        "bert-gelu-no-embed",
        "bert",
        "bert",
        1,
        ((MS, "Attention", 2), SKIP_LN, (MS, "Gelu", 2)),
        ("!enable_embed_layer_norm", "!enable_bias_gelu"),
        since=ATTENTION_SINCE,
    ),
    Variant(
        "distilbert-mha",
        "distilbert",
        "bert",
        1,
        (EMBED, (MS, "MultiHeadAttention", 2), SKIP_LN, BIAS_GELU),
        ("use_multi_head_attention",),
        since=ATTENTION_SINCE,
    ),
    Variant(
        "distilbert-mha-no-embed",
        "distilbert",
        "bert",
        1,
        ((MS, "MultiHeadAttention", 2), SKIP_LN, BIAS_GELU),
        ("use_multi_head_attention", "!enable_embed_layer_norm"),
        since=ATTENTION_SINCE,
    ),
    Variant("gpt2", "gpt2", "gpt2", 1, (SKIP_LN, (MS, "FastGelu", 2))),
    Variant(
        "llama-level0",
        "llama",
        "gpt2",
        0,
        ((MS, "SkipSimplifiedLayerNormalization", 4), ("", "SimplifiedLayerNormalization", 1)),
    ),
    Variant(
        "llama-level2",
        "llama",
        "gpt2",
        2,
        ((MS, "QuickGelu", 2), ("", "SimplifiedLayerNormalization", 5)),
        symbolic_shapes=False,
    ),
)


def _ort_version() -> tuple[int, int]:
    import onnxruntime

    major, minor = onnxruntime.__version__.split(".")[:2]
    return int(major), int(minor)


def _param(variant: Variant) -> object:
    """``variant``, skipped where onnxruntime is older than the fusions it records."""
    if _ort_version() < variant.since:
        since = ".".join(map(str, variant.since))
        mark = pytest.mark.skip(reason=f"onnxruntime < {since} does not make the fusions of {variant.id}")
        return pytest.param(variant, id=variant.id, marks=mark)
    return pytest.param(variant, id=variant.id)


def fused_operators(model: onnx.ModelProto) -> dict[tuple[str, str], int]:
    """``{(domain, op): count}`` of the nodes that are no standard ONNX operator."""
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for node in model.graph.node:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if domain != "" or not onnx.defs.has(node.op_type):
            counts[(domain, node.op_type)] += 1
    return dict(counts)


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("optimized")


@functools.cache
def _optimized(variant: Variant, directory: Path) -> tuple[Path, onnx.ModelProto]:
    """The optimized model of ``variant``, written to ``directory / variant.id``."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    exported = models.save(models.exported(variant.model).model, directory / variant.id, "exported")
    options = FusionOptions(variant.model_type)
    for flag in variant.options:
        assert hasattr(options, flag.lstrip("!")), f"FusionOptions has no {flag}"
        setattr(options, flag.lstrip("!"), not flag.startswith("!"))
    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)  # "symbolic shape inference failed"
    optimizer = optimize_model(
        str(exported),
        model_type=variant.model_type,
        num_heads=models.HEADS,
        hidden_size=models.HIDDEN,
        opt_level=variant.opt_level,
        use_gpu=False,
        optimization_options=options,
    )
    model = optimizer.model
    return models.save(model, directory / variant.id, "optimized"), model


@functools.cache
def _prepared(variant: Variant, directory: Path) -> tuple[Path, onnx.ModelProto]:
    """The optimized model with the ``com.microsoft`` opset import and the types of the fused operators' outputs
    from ONNX Runtime's symbolic shape inference (onnxtrain types only the normalizations and GELUs itself)."""
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    _, optimized = _optimized(variant, directory)
    model = onnx.ModelProto()
    model.CopyFrom(optimized)
    domains = {node.domain for node in model.graph.node}
    if MS in domains and all(opset.domain != MS for opset in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS, 1))
    if variant.symbolic_shapes:
        model = SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    return models.save(model, directory / variant.id, "prepared"), model


def _params(name: str) -> dict[str, np.ndarray]:
    ex = models.exported(name)
    return {p: ex.state[p].numpy() for p in ex.parameters}


def _trained(model: onnx.ModelProto, params: dict[str, np.ndarray]) -> dict[str, tuple[fused.Piece, ...]]:
    """The initializers that hold torch's parameters and are trained. GPT-2's head, the embedding transposed and
    folded by the optimizer into a constant, is read as the embedding transposed again
    (:mod:`onnxtrain.graph.passes.retie`): every parameter that two initializers hold whole is tied so, and the
    embedding's gradient then holds the head's part."""
    mapping = fused.parameter_map(model, params)
    tied = transposed_copies(model)
    holders = collections.defaultdict(set)
    for name, pieces in mapping.items():
        if len(pieces) == 1:
            holders[pieces[0].param].add(name)
    twice = [names for names in holders.values() if len(names) > 1]
    assert all(len(names & set(tied)) == 1 and names <= {*tied, *tied.values()} for names in twice), (twice, tied)
    return {name: pieces for name, pieces in mapping.items() if name not in tied}


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.id for v in VARIANTS])
def test_the_optimizer_fuses_what_the_variant_records(variant: Variant, directory: Path) -> None:
    if _ort_version() < variant.since:
        pytest.skip(f"onnxruntime < {'.'.join(map(str, variant.since))} does not make the fusions of {variant.id}")
    _, model = _optimized(variant, directory)
    assert fused_operators(model) == variant.expected, f"{variant.id}: fused operators changed"
    mapping = fused.parameter_map(model, _params(variant.model))
    assert not fused.unmapped(mapping, _params(variant.model)), (
        f"{variant.id}: no initializer holds {fused.unmapped(mapping, _params(variant.model))}; "
        f"initializers: {fused.describe(mapping)}"
    )


@pytest.mark.parametrize("variant", [_param(v) for v in VARIANTS])
def test_every_gradient_matches_torch_after_the_optimizer(variant: Variant, directory: Path) -> None:
    path, model = _prepared(variant, directory)
    params = _params(variant.model)
    mapping = _trained(model, params)
    assert not fused.unmapped(mapping, params), f"{variant.id}: unmapped {fused.unmapped(mapping, params)}"
    paths = train.write_artifacts(path, list(mapping), directory / variant.id / "artifacts")
    trained = train.load(paths)
    ex = models.exported(variant.model)
    rng = np.random.default_rng(11)
    for length in LENGTHS:
        data = models.batch(variant.model, rng, length)
        loss = train.step(trained, data)
        want = models.torch_reference(ex, data)
        np.testing.assert_allclose(loss, want.loss, rtol=1e-5, err_msg=f"{variant.id}, length {length}: loss")
        got = fused.pull_back(train.gradients(trained, list(mapping)), mapping, params)
        for param in params:
            models.assert_grad_close(
                got[param], want.grads[param], f"{variant.id}, length {length}: d loss / d {param}"
            )


@pytest.mark.parametrize("variant_id", ["gpt2", "llama-level0"])
def test_the_optimizers_own_output_trains_without_preparation(variant_id: str, directory: Path) -> None:
    """The optimizer's output as it writes it, neither typed by ONNX Runtime's symbolic shape inference nor
    given the com.microsoft import: onnxtrain types the outputs of the normalizations and GELUs itself
    (:mod:`onnxtrain.graph.contrib_types`), and the gradients are torch's."""
    variant = next(v for v in VARIANTS if v.id == variant_id)
    path, model = _optimized(variant, directory)
    params = _params(variant.model)
    mapping = _trained(model, params)
    paths = train.write_artifacts(path, list(mapping), directory / f"raw-{variant_id}" / "artifacts")
    trained = train.load(paths)
    ex = models.exported(variant.model)
    data = models.batch(variant.model, np.random.default_rng(12), LENGTHS[-1])
    want = models.torch_reference(ex, data)
    np.testing.assert_allclose(train.step(trained, data), want.loss, rtol=1e-5, err_msg=f"raw {variant_id}: loss")
    got = fused.pull_back(train.gradients(trained, list(mapping)), mapping, params)
    for param in params:
        models.assert_grad_close(got[param], want.grads[param], f"raw {variant_id}: d loss / d {param}")
