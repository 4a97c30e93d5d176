"""``onnxtrain generate``: the training artifacts of a forward-only ONNX model (``generate_artifacts``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxtrain.cli.common import Parser, UsageError, non_negative, positive, size_text, speaking_options

if TYPE_CHECKING:
    from onnxtrain import optim
    from onnxtrain.blocks import Block

#: ``--loss`` choices: ``onnxtrain.artifacts.LossType`` names; ``none``: the model's first output is the loss.
LOSSES: dict[str, str | None] = {
    "mse": "MSELoss",
    "l1": "L1Loss",
    "huber": "HuberLoss",
    "smooth-l1": "SmoothL1Loss",
    "ce": "CrossEntropyLoss",
    "nll": "NLLLoss",
    "bce": "BCEWithLogitsLoss",
    "bce-probs": "BCELoss",
    "kl-div": "KLDivLoss",
    "none": None,
}
#: Losses on class scores: the training and eval models also output the scores, for the accuracy.
SCORED = ("ce", "nll", "bce", "bce-probs")
#: Losses that take ``--ignore-index``.
IGNORING = ("ce", "nll")
#: The library's argument names in its errors, and the options that set them.
LIBRARY_ARGUMENTS = {
    "requires_grad": "--requires-grad",
    "frozen_params": "--frozen",
    "loss_input_names": "--loss-inputs",
    "precision_overrides": "--precision-override",
    "activation_checkpoints": "--activation-checkpoints",
}
#: ``--optimizer`` choices: ``onnxtrain.optim`` classes.
OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad", "rmsprop": "RMSprop"}
#: Optimizers that take a momentum.
WITH_MOMENTUM = ("sgd", "rmsprop")
#: ``--target`` choices (``onnxtrain.artifacts.TARGETS``; not imported, to keep ``--help`` fast).
TARGETS = ("onnxruntime", "onnxruntime-training")
#: ``--requires-grad`` value that selects every weight (``onnxtrain.artifacts.trainable_parameters``).
WEIGHTS = "weights"
#: An older name of ``weights``, kept for the command lines that use it.
ALL_FLOAT = "all-float"
#: ``--requires-grad`` value that selects the LoRA adapters ``add_adapters`` added.
ADAPTERS = "adapters"


def add_parser(subcommands: Any) -> None:
    """Add ``generate`` to the ``onnxtrain`` parser's subcommands."""
    parser: Parser = subcommands.add_parser(
        "generate",
        help="write the training, eval and optimizer models and the checkpoint of a model",
        description="Write the training, eval and optimizer models and the initial checkpoint of a forward-only "
        "ONNX model into DIR (onnxtrain.artifacts.generate_artifacts). Put MODEL first: --requires-grad and "
        "--frozen take every name that follows them.",
    )
    parser.add_argument("model", metavar="MODEL", type=Path, help="the forward-only ONNX model (.onnx)")
    parser.add_argument(
        "--requires-grad", nargs="+", action="extend", required=True, metavar="NAME",
        help=f"the initializers to train; {WEIGHTS} (or {ALL_FLOAT}): every weight, as `onnxtrain inspect MODEL` "
        f"lists them (not constants nor BatchNorm running statistics), but those --frozen; {ADAPTERS}: the LoRA "
        "adapters (onnxtrain.lora.add_adapters); a glob ('*lora_A*') names the float initializers it matches",
    )  # fmt: skip
    parser.add_argument(
        "--frozen", nargs="+", action="extend", default=[], metavar="NAME", help="initializers kept as they are"
    )
    parser.add_argument(
        "--loss", required=True, type=loss_option, metavar="LOSS",
        help=f"{', '.join(LOSSES)}, or a loss Block of yours as module:Class or path/to/loss.py:Class "
        "(docs/cli.md). ce: cross-entropy on class scores; bce: binary cross-entropy on logits, bce-probs: on "
        "probabilities; none: the model's first output already is the loss",
    )  # fmt: skip
    parser.add_argument(
        "--ignore-index", type=int, metavar="LABEL",
        help="for ce and nll: the label that counts for nothing (a padded position's, as torch's -100), left out of "
        "the loss, its mean and the accuracy",
    )  # fmt: skip
    parser.add_argument("--optimizer", choices=list(OPTIMIZERS), default="adamw", help="default: adamw")
    parser.add_argument(
        "--lr", type=positive, metavar="LR",
        help="the learning rate, stored in the checkpoint for `onnxtrain train` (default there: 1e-3)",
    )  # fmt: skip
    parser.add_argument("--momentum", type=non_negative, metavar="M", help="for sgd and rmsprop")
    parser.add_argument("--weight-decay", type=non_negative, metavar="W", help="(decoupled for adamw)")
    parser.add_argument(
        "--no-decay",
        nargs="+",
        action="extend",
        default=[],
        metavar="PATTERN",
        help="parameters left out of weight decay: names or their parts after a dot, globs (bias '*norm.weight')",
    )
    parser.add_argument(
        "--lr-scale",
        nargs="+",
        action="extend",
        default=[],
        type=_scale,
        metavar="PATTERN=FACTOR",
        help="parameters stepped at the learning rate times FACTOR ('classifier.*=10'), the first pattern that "
        "matches a name deciding; patterns as --no-decay's",
    )
    clipping = parser.add_mutually_exclusive_group()
    clipping.add_argument("--max-grad-norm", type=positive, metavar="N", help="clip the gradients' global norm to N")
    clipping.add_argument("--clip-grad-value", type=positive, metavar="V", help="clip each gradient element to [-V, V]")
    parser.add_argument(
        "--grad-norm-type", type=norm_type, metavar="P",
        help="--max-grad-norm's norm: 2 (L2, the default), 1, any P > 0, or inf (the largest magnitude)",
    )  # fmt: skip
    parser.add_argument("-o", "--out", required=True, type=Path, metavar="DIR", help="where the artifacts go")
    parser.add_argument("--target", choices=TARGETS, default="onnxruntime", help="the runtime (default: onnxruntime)")
    parser.add_argument("--prefix", default="", help="a prefix for the file names")
    parser.add_argument(
        "--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
        help="compute the forward and backward in bfloat16 or float16 where the autocast policy says "
        "(docs/artifacts.md, Mixed precision), parameters and optimizer state in float32 (default: fp32)",
    )  # fmt: skip
    parser.add_argument(
        "--precision-override", nargs="+", action="extend", default=[], metavar="OP=MODE", type=precision_override,
        help="move an operator type in the autocast policy: MatMul=float32, Softmax=half",
    )  # fmt: skip
    parser.add_argument(
        "--activation-checkpoints", nargs="*", action="extend", metavar="VALUE",
        help="keep only these forward values for the backward and recompute the others there, one more forward "
        "pass per step for less memory; with no VALUE, the layer boundaries (docs/artifacts.md, Activation "
        "checkpointing)",
    )  # fmt: skip
    parser.add_argument(
        "--loss-inputs",
        nargs="+",
        action="extend",
        metavar="NAME",
        help="the model outputs the loss reads (default: all, in order)",
    )
    parser.add_argument(
        "--no-scores", action="store_true",
        help=f"for {', '.join(SCORED)}: leave the class scores out of the training and eval models' outputs "
        "(train then reports no accuracy), for scores too large to copy at every step",
    )  # fmt: skip
    parser.add_argument(
        "--discard-run", action="store_true",
        help="where DIR holds a training run (trained_checkpoint), remove it with the artifacts it belonged to "
        "(without this option, generate refuses to write there)",
    )  # fmt: skip
    parser.set_defaults(run=run, prog=parser.prog)


def precision_override(text: str) -> tuple[str, str]:
    """An argument type: ``OP=half`` or ``OP=float32``."""
    op_type, _, mode = text.partition("=")
    if not op_type or mode not in ("half", "float32"):
        raise argparse.ArgumentTypeError(f"{text!r} is not OP=half or OP=float32 (for example MatMul=float32)")
    return op_type, mode


def loss_option(text: str) -> str:
    """An argument type: a built-in loss (a key of :data:`LOSSES`), or a class as ``module:Class``."""
    from onnxtrain.cli.custom_loss import names_a_class

    if text in LOSSES or names_a_class(text):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(LOSSES)}, or name a loss class as module:Class or "
        "path/to/loss.py:Class)"
    )


def run(args: argparse.Namespace) -> int:
    """Generate the artifacts; print what was written."""
    from onnxtrain import artifacts
    from onnxtrain.loop import remove_checkpoint, with_learning_rate

    optimizer = optimizer_block(
        args.optimizer, args.momentum, args.weight_decay, clipping_of(args), args.no_decay, dict(args.lr_scale)
    )
    if not args.model.is_file():
        raise FileNotFoundError(f"no ONNX model at {str(args.model)!r}: give the path of an existing .onnx file")
    loss = loss_of(args.loss, args.ignore_index)
    outputs = _loss_outputs(args)
    runs = _earlier_runs(args)
    with speaking_options(LIBRARY_ARGUMENTS):
        requires = trainable_names(args.model, args.requires_grad, args.frozen)
        built = artifacts.build_artifacts(
            args.model, requires_grad=requires, frozen_params=args.frozen, loss=loss, optimizer=optimizer,
            additional_output_names=scores_output(args, outputs), loss_input_names=args.loss_inputs, target=args.target,
            precision=args.precision, precision_overrides=dict(args.precision_override),
            activation_checkpoints=checkpoints_of(args.activation_checkpoints),
            in_memory=False,  # the weights are read when written, a tensor at a time
        )  # fmt: skip
    if args.lr is not None:  # in the one checkpoint written, not a second write of it
        built = replace(built, checkpoint=with_learning_rate(built.checkpoint, args.lr))
    paths = artifacts.write_artifacts(built, args.out, args.prefix)
    for path in runs:  # the new artifacts are in place: the run of the old ones goes
        remove_checkpoint(path)
        print(f"removed {path.name}, a training run of the artifacts replaced (--discard-run)")
    print(f"wrote {len(paths)} files to {args.out.resolve()}:")
    for path in paths.values():
        print(f"  {path.name} ({size_text(path.stat().st_size)})")
    updated = [o.name[: -len(".updated")] for o in built.training_model.graph.output if o.name.endswith(".updated")]
    statistics = f", {len(updated)} running statistics (updated in training mode)" if updated else ""
    frozen = len(built.checkpoint.frozen) - len(updated)
    print(f"{len(built.checkpoint.trainable)} trainable, {frozen} frozen{statistics}; optimizer {optimizer!r}")
    if args.lr is not None:
        print(f"learning rate {args.lr:g} (stored in {paths['checkpoint'].name})")
    print(f"next: onnxtrain train {args.out} --data FILE.npz --epochs N --batch-size B")
    return 0


def _earlier_runs(args: argparse.Namespace) -> list[Path]:
    """The checkpoints of a training run in ``--out`` (``trained_checkpoint``, ``best_checkpoint``), which new
    artifacts would leave belonging to other models: ``UsageError`` unless ``--discard-run``."""
    from onnxtrain.loop import ArtifactFiles

    files = ArtifactFiles(args.out, args.prefix)
    runs = [path for path in (files.trained_checkpoint, files.best_checkpoint) if path.exists()]
    if runs and not args.discard_run:
        raise UsageError(
            f"{args.out} holds a training run ({', '.join(path.name for path in runs)}) of the artifacts there, "
            "which the new ones would leave belonging to other models (its resume, inspect and export would fail "
            "or mix the two): write the new artifacts to another folder, or pass --discard-run to remove the run"
        )
    return runs


def _loss_outputs(args: argparse.Namespace) -> list[str]:
    """The model outputs a built-in loss reads by default, every output (``[]`` with ``--loss-inputs`` or another
    loss: nothing read); ``UsageError`` where there are several, as such a loss reads one output and its target:
    the second output would be the first one's target, and training would pull one toward the other, taking no
    labels."""
    if args.loss_inputs or args.loss not in LOSSES or LOSSES[args.loss] is None:
        return []
    from onnxtrain.graph.io import load_base_model

    proto, _ = load_base_model(args.model, check_data=False, in_file=True)  # no weight read: only the names
    outputs = [value.name for value in proto.graph.output]
    if len(outputs) > 1:
        listed = ", ".join(repr(name) for name in outputs)
        raise UsageError(
            f"the model has {len(outputs)} outputs ({listed}), and --loss {args.loss} reads one output and its "
            f"target (from the data): name the output to train with --loss-inputs {outputs[0]} (the others stay "
            "outputs of the eval model); for a loss over several outputs, give a loss block of yours (docs/cli.md)"
        )
    return outputs


def checkpoints_of(values: list[str] | None) -> str | list[str] | None:
    """``activation_checkpoints`` for ``--activation-checkpoints``: absent, ``None``; given alone, ``"auto"``."""
    if values is None:
        return None
    return values or "auto"


def loss_of(option: str, ignore_index: int | None = None) -> Block | str | None:
    """The loss for ``--loss``: a ``LossType`` name, ``None`` (the model's first output), or a custom block;
    with ``ignore_index`` (``ce`` and ``nll`` only), the loss block that ignores that label."""
    if ignore_index is not None:
        if option not in IGNORING:
            raise UsageError(f"--ignore-index is for --loss {' or '.join(IGNORING)}, not {option}")
        from onnxtrain import losses

        return getattr(losses, str(LOSSES[option]))(ignore_index=ignore_index)
    if option in LOSSES:
        return LOSSES[option]
    from onnxtrain.cli.custom_loss import custom_loss

    return custom_loss(option)


def scores_output(args: argparse.Namespace, outputs: list[str]) -> list[str]:
    """The model output a classification loss reads (``[]`` for the other losses, or with ``--no-scores``):
    the first of ``--loss-inputs``, else of ``outputs`` (:func:`_loss_outputs`, read once).

    The training and eval models output it too, so that ``train`` can
    measure the accuracy of each step's and each validation batch's scores.
    """
    if args.loss not in SCORED or args.no_scores:
        return []
    return (args.loss_inputs or outputs)[:1]


def norm_type(text: str) -> float:
    """An argument type: a number > 0, or ``inf``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if math.isnan(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number > 0 (or inf: the largest magnitude)")
    return value


def clipping_of(args: argparse.Namespace) -> optim.GradientClipping | None:
    """The clipping ``--max-grad-norm`` (with ``--grad-norm-type``) or ``--clip-grad-value`` asks for, or ``None``."""
    from onnxtrain import optim

    if args.grad_norm_type is not None and args.max_grad_norm is None:
        raise UsageError("--grad-norm-type is the norm --max-grad-norm clips: give --max-grad-norm too")
    if args.max_grad_norm is not None:
        return optim.ClipGradNorm(args.max_grad_norm, 2.0 if args.grad_norm_type is None else args.grad_norm_type)
    return None if args.clip_grad_value is None else optim.ClipGradValue(args.clip_grad_value)


def optimizer_block(
    name: str,
    momentum: float | None,
    weight_decay: float | None,
    clip_grad: optim.GradientClipping | None,
    no_decay: Sequence[str] = (),
    lr_scale: Mapping[str, float] | None = None,
) -> optim.Optimizer:
    """The ``onnxtrain.optim`` optimizer for ``--optimizer`` and its options."""
    from onnxtrain import optim

    options: dict[str, Any] = {}
    if momentum is not None:
        if name not in WITH_MOMENTUM:
            raise UsageError(f"--momentum applies to {' and '.join(WITH_MOMENTUM)}, not {name}")
        options["momentum"] = momentum
    if weight_decay is not None:
        options["weight_decay"] = weight_decay
    if clip_grad is not None:
        options["clip_grad"] = clip_grad
    if no_decay:
        if not weight_decay:
            raise UsageError("--no-decay leaves parameters out of weight decay: give --weight-decay too")
        options["no_decay"] = list(no_decay)
    if lr_scale:
        options["lr_scale"] = dict(lr_scale)
    return getattr(optim, OPTIMIZERS[name])(**options)


def _scale(text: str) -> tuple[str, float]:
    """``PATTERN=FACTOR`` of ``--lr-scale``: the pattern and a factor > 0."""
    pattern, sign, factor = text.rpartition("=")
    try:
        value = float(factor)
    except ValueError:
        value = math.nan
    if not sign or not pattern or not 0.0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not PATTERN=FACTOR with a factor > 0 ('classifier.*=10')")
    return pattern, value


def trainable_names(model: Path, requested: list[str], frozen: list[str]) -> list[str]:
    """``requested``, each as named, or expanded: ``weights`` (or ``all-float``) to every weight of ``model`` not
    frozen (``onnxtrain.artifacts.trainable_parameters``: constants and running statistics are not weights),
    ``adapters`` to the LoRA adapters ``add_adapters`` added, a glob (``*lora_A*``) to the float initializers it
    matches; in that order, each name once."""
    if not any(name in (WEIGHTS, ALL_FLOAT, ADAPTERS) or _is_glob(name) for name in requested):
        return requested
    import fnmatch

    from onnxtrain.artifacts import trainable_parameters
    from onnxtrain.graph import dtypes
    from onnxtrain.graph.io import load_base_model
    from onnxtrain.lora.record import adapters_of

    proto, _ = load_base_model(model, check_data=False, in_file=True)  # no weight read: names and types
    names: list[str] = []
    for name in requested:
        if name in (WEIGHTS, ALL_FLOAT):
            found = [weight for weight in trainable_parameters(proto) if weight not in frozen]
            if not found:
                raise ValueError(
                    f"{model} has no weights to train (besides those --frozen); `onnxtrain inspect {model}` lists "
                    "its initializers and their roles: name the ones to train"
                )
        elif name == ADAPTERS:
            found = [tensor for adapter in adapters_of(proto) for tensor in (adapter.a, adapter.b)]
            if not found:
                raise ValueError(
                    f"{model} has no LoRA adapters to train: onnxtrain.lora.add_adapters adds them "
                    "(docs/lora.md); name the initializers to train, or pass weights"
                )
        elif _is_glob(name):
            floats = [t.name for t in proto.graph.initializer if dtypes.is_float(t.data_type) and t.name not in frozen]
            found = fnmatch.filter(floats, name)
            if not found:
                raise ValueError(
                    f"--requires-grad {name!r} matches no float initializer of {model} (besides those --frozen); "
                    f"its float initializers include {floats[:6]}"
                )
        else:
            found = [name]
        names += found
    return list(dict.fromkeys(names))


def _is_glob(name: str) -> bool:
    """Whether ``name`` is a pattern (``*``, ``?``, ``[``): initializer names hold none of those characters."""
    return any(character in name for character in "*?[")


__all__ = [
    "ADAPTERS",
    "ALL_FLOAT",
    "LIBRARY_ARGUMENTS",
    "LOSSES",
    "OPTIMIZERS",
    "SCORED",
    "WEIGHTS",
    "add_parser",
    "clipping_of",
    "loss_of",
    "loss_option",
    "norm_type",
    "optimizer_block",
    "run",
    "scores_output",
    "trainable_names",
]
