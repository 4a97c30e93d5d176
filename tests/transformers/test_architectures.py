"""More Hugging Face architectures train every parameter with torch's gradients, as transformers initialises them.

Beyond the four models of :mod:`tests.transformers.models`, five causal
language models whose layers differ: Gemma (RMSNorm scaling by ``1 + w``, so
its norm weights, all zeros, are read through an ``Add`` of a constant),
GPT-NeoX (rotary embeddings on part of each head, parallel residual), Phi-3
(fused query-key-value and gate-up projections), BLOOM (ALiBi position
biases, LayerNorm after the embedding) and OPT (learned positions with an
offset); and three classifiers with parameters read as data: ViT (a class
token expanded and concatenated with the patch embeddings, pixels in),
DeBERTa-v2 (a relative-position table sliced into projections) and
wav2vec 2.0 (a waveform in; GroupNorm's weight and bias unsqueezed after an
``InstanceNormalization``, a positional convolution whose weight is
computed by weight normalization from two parameters); and three more
whose parameters are read in other ways: ALBERT (one layer's weights read by
each of its 3 layers, a factorized embedding), Swin (windows shifted by
``Roll``, a relative-position bias table gathered by a buffer of indices)
and ConvNeXt (7 x 7 depthwise convolutions, layer scales multiplying each
block's output); and three image classifiers whose parameters are resized
or unsqueezed: BEiT (a relative-position table interpolated, then gathered),
DINOv2 (position embeddings interpolated to the image) and PoolFormer (pooling
minus its input, layer scales unsqueezed onto the channels). Tiny configs
(2 layers or stages, 32 wide or less, vocabulary 120), no dropout, the parameters as
transformers initialises them, exported by torch's TorchScript exporter;
``trainable_parameters`` must find every parameter of torch and nothing
else, and one step's loss and every gradient must equal torch autograd's. The ids
avoid the padding tokens (0, and OPT's 1), whose embedding rows torch leaves
without gradient (``nn.Embedding(padding_idx=...)``), a rule TorchScript's
export does not carry (``artifacts.set_embedding`` gives it back;
``test_embeddings.py``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxtrain import api, artifacts
from tests.helpers import export_for_training
from tests.transformers import models, train

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 120
CAUSAL = ("gemma", "gpt_neox", "phi3", "bloom", "opt")
CLASSIFIERS = ("vit", "deberta", "wav2vec2", "albert", "swin", "convnext", "beit", "dinov2", "poolformer")
#: The classifiers of images.
IMAGES = ("vit", "swin", "convnext", "beit", "dinov2", "poolformer")
ARCHITECTURES = CAUSAL + CLASSIFIERS
CLASSES = 3
#: ViT's images: 3 channels of 16 x 16, in patches of 4.
IMAGE = (3, 16, 16)
#: wav2vec 2.0's waveforms: samples per sequence position, the product of its convolutions' strides.
SAMPLES_PER_STEP = 8


def _config(name: str) -> Any:
    """The tiny config of ``name``: 2 layers, 32 wide, 4 heads, no dropout, no cache."""
    common = {
        "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 64, "use_cache": False, "attn_implementation": "eager",
    }  # fmt: skip
    if name == "gemma":
        return transformers.GemmaConfig(**common, intermediate_size=64, num_key_value_heads=2, head_dim=8)
    if name == "gpt_neox":
        return transformers.GPTNeoXConfig(**common, intermediate_size=64, rotary_pct=0.5)
    if name == "phi3":
        return transformers.Phi3Config(**common, intermediate_size=64, num_key_value_heads=2, pad_token_id=0)
    if name == "bloom":
        return transformers.BloomConfig(
            vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, use_cache=False, hidden_dropout=0.0,
            attention_dropout=0.0, attn_implementation="eager",
        )  # fmt: skip
    if name == "vit":
        return transformers.ViTConfig(
            image_size=IMAGE[1], patch_size=4, num_channels=IMAGE[0], hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, num_labels=CLASSES, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, attn_implementation="eager",
        )  # fmt: skip
    if name == "deberta":
        return transformers.DebertaV2Config(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, num_labels=CLASSES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            pooler_dropout=0.0, relative_attention=True, position_buckets=8, max_relative_positions=16,
            pos_att_type=["p2c", "c2p"],
        )  # fmt: skip
    if name == "wav2vec2":
        return transformers.Wav2Vec2Config(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            conv_dim=(8, 8), conv_stride=(4, 2), conv_kernel=(8, 4), num_conv_pos_embeddings=4,
            num_conv_pos_embedding_groups=2, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
            feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, num_labels=CLASSES,
            classifier_proj_size=16,
        )  # fmt: skip
    if name == "albert":
        return transformers.AlbertConfig(
            vocab_size=VOCAB, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, num_labels=CLASSES, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
        )  # fmt: skip
    if name == "swin":
        return transformers.SwinConfig(
            image_size=IMAGE[1], patch_size=2, num_channels=IMAGE[0], embed_dim=16, depths=[1, 1], num_heads=[2, 2],
            window_size=4, num_labels=CLASSES, drop_path_rate=0.0, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )  # fmt: skip
    if name == "convnext":
        return transformers.ConvNextConfig(
            num_channels=IMAGE[0], num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], patch_size=2,
            num_labels=CLASSES, drop_path_rate=0.0,
        )  # fmt: skip
    if name == "beit":
        return transformers.BeitConfig(
            image_size=IMAGE[1], patch_size=4, num_channels=IMAGE[0], hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=64, num_labels=CLASSES, use_relative_position_bias=True,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
            layer_scale_init_value=0.1,
        )  # fmt: skip
    if name == "dinov2":
        return transformers.Dinov2Config(
            image_size=IMAGE[1], patch_size=4, num_channels=IMAGE[0], hidden_size=32, num_hidden_layers=2,
            num_attention_heads=4, mlp_ratio=2, num_labels=CLASSES, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
        )  # fmt: skip
    if name == "poolformer":
        return transformers.PoolFormerConfig(
            num_channels=IMAGE[0], num_encoder_blocks=2, hidden_sizes=[8, 16], depths=[1, 1], patch_sizes=[3, 3],
            strides=[2, 2], padding=[1, 1], num_labels=CLASSES, drop_path_rate=0.0, hidden_dropout_prob=0.0,
        )  # fmt: skip
    if name == "opt":
        return transformers.OPTConfig(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
            max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0, use_cache=False,
            attn_implementation="eager",
        )  # fmt: skip
    raise ValueError(f"no architecture {name!r}; choose one of {list(ARCHITECTURES)}")


def _module(name: str) -> Any:
    """``inputs -> logits``, in train mode: ``[batch * seq, vocab]`` for a causal LM of architecture ``name``,
    ``[batch, classes]`` for a classifier."""
    model_class = {
        "gemma": transformers.GemmaForCausalLM,
        "gpt_neox": transformers.GPTNeoXForCausalLM,
        "phi3": transformers.Phi3ForCausalLM,
        "bloom": transformers.BloomForCausalLM,
        "opt": transformers.OPTForCausalLM,
        "vit": transformers.ViTForImageClassification,
        "deberta": transformers.DebertaV2ForSequenceClassification,
        "wav2vec2": transformers.Wav2Vec2ForSequenceClassification,
        "albert": transformers.AlbertForSequenceClassification,
        "swin": transformers.SwinForImageClassification,
        "convnext": transformers.ConvNextForImageClassification,
        "beit": transformers.BeitForImageClassification,
        "dinov2": transformers.Dinov2ForImageClassification,
        "poolformer": transformers.PoolFormerForImageClassification,
    }[name]

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model_class(_config(name))

        def forward(self, x: Any) -> Any:
            if name in IMAGES:
                return self.model(pixel_values=x, return_dict=False)[0]
            if name == "wav2vec2":
                return self.model(input_values=x, return_dict=False)[0]
            logits = self.model(input_ids=x, attention_mask=torch.ones_like(x), return_dict=False)[0]
            return logits if name in CLASSIFIERS else logits.flatten(0, 1)

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Logits().train()


def _batch(name: str, rng: np.random.Generator, size: int, length: int) -> dict[str, np.ndarray]:
    """Inputs ``x`` (ids without the padding tokens, pixels or a waveform) and int64 labels for ``name``'s
    logits."""
    if name in IMAGES:
        x = rng.standard_normal((size, *IMAGE)).astype(np.float32)
    elif name == "wav2vec2":
        x = rng.standard_normal((size, SAMPLES_PER_STEP * length)).astype(np.float32)
    else:
        x = rng.integers(2, VOCAB, (size, length))
    labels = rng.integers(0, CLASSES, (size,)) if name in CLASSIFIERS else rng.integers(0, VOCAB, (size * length,))
    return {"ids": x, "labels": labels}


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_parameter_trains_with_torchs_gradient(name: str, tmp_path: Path) -> None:
    module = _module(name)
    example = torch.from_numpy(_batch(name, np.random.default_rng(0), 2, 5)["ids"])
    axes = {"x": {0: "batch"} if name in IMAGES else {0: "batch", 1: "seq"}, "logits": {0: "rows"}}  # wav2vec2: samples
    model = export_for_training(module, (example,), ["x"], ["logits"], opset=models.OPSET, dynamic_axes=axes)
    weights = artifacts.trainable_parameters(model)
    parameters = dict(module.named_parameters(remove_duplicate=False))
    # tied parameters once; those the forward never reads (DINOv2's mask token) are not exported
    exported = {id(parameters[t.name]) for t in model.graph.initializer if t.name in parameters}
    tensors = {id(p): n for n, p in module.named_parameters() if id(p) in exported}
    found = {tensors[id(parameters[w])] for w in weights if w in parameters}
    assert sorted(found) == sorted(tensors.values()), (
        f"{name}: trainable_parameters missed {set(tensors.values()) - found}"
    )
    assert all(w in parameters for w in weights), (
        f"{name}: {[w for w in weights if w not in parameters]} are not torch's"
    )

    paths = train.write_artifacts(models.save(model, tmp_path, name), weights, tmp_path / "artifacts")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module_ = api.Module(paths["training_model"], state, paths["eval_model"], session_options=train.session_options())
    data = _batch(name, np.random.default_rng(7), 3, 11)
    loss = train.step(train.Trained(paths, state, module_, None), data)

    module.zero_grad(set_to_none=True)
    logits = module(torch.from_numpy(data["ids"]))
    want = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["labels"]))
    want.backward()
    np.testing.assert_allclose(loss, float(want.item()), rtol=1e-5, err_msg=f"{name}: loss")
    unread = [n for n, p in module.named_parameters() if id(p) not in exported and p.grad is not None]
    assert not unread, f"{name}: {unread} were not exported, yet torch's loss reads them"
    for weight in weights:
        grad = parameters[weight].grad
        expected = np.zeros_like(state.parameters[weight].data) if grad is None else grad.numpy()
        models.assert_grad_close(state.parameters[weight].grad, expected, f"{name}: d loss / d {weight}")


def test_a_causal_lm_exported_at_a_fixed_length_trains_as_torch(tmp_path: Path) -> None:
    """Qwen2 with transformers' default attention (SDPA, exported with an ``IsNaN`` guard over its
    probabilities), its sequence fixed at 128 by the export: the masks are large enough for the training model
    to recompute them in the backward, held back until it needs them. A bool value held by ``Where``, which
    onnxruntime has no kernel for, made the training model fail to load."""
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=128, use_cache=False,
    )  # fmt: skip

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformers.Qwen2ForCausalLM(config)

        def forward(self, x: Any) -> Any:
            return self.model(input_ids=x, attention_mask=torch.ones_like(x), return_dict=False)[0].flatten(0, 1)

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = Logits().train()
    rng = np.random.default_rng(0)
    data = {"ids": rng.integers(2, VOCAB, (2, 128)), "labels": rng.integers(0, VOCAB, (2 * 128,))}
    axes = {"x": {0: "batch"}, "logits": {0: "rows"}}
    model = export_for_training(
        module, (torch.from_numpy(data["ids"]),), ["x"], ["logits"], opset=models.OPSET, dynamic_axes=axes
    )
    weights = artifacts.trainable_parameters(model)
    paths = train.write_artifacts(models.save(model, tmp_path, "qwen2"), weights, tmp_path / "artifacts")
    state = api.CheckpointState.load_checkpoint(paths["checkpoint"])
    module_ = api.Module(paths["training_model"], state, paths["eval_model"], session_options=train.session_options())
    loss = train.step(train.Trained(paths, state, module_, None), data)

    parameters = dict(module.named_parameters(remove_duplicate=False))
    module.zero_grad(set_to_none=True)
    want = torch.nn.functional.cross_entropy(module(torch.from_numpy(data["ids"])), torch.from_numpy(data["labels"]))
    want.backward()
    np.testing.assert_allclose(loss, float(want.item()), rtol=1e-5)
    for weight in weights:
        models.assert_grad_close(state.parameters[weight].grad, parameters[weight].grad.numpy(), f"d loss / d {weight}")
