"""``onnxtrain demo``: the whole pipeline on scikit-learn's handwritten digits, in a few seconds.

Build an MLP with blocks, generate its artifacts (cross-entropy, AdamW), train
it with the loop ``onnxtrain train`` uses, export the inference model, measure
its accuracy on held-out digits and plot the loss curves.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from onnxtrain.cli.common import Parser, count, size_text

#: The demo's learning rate (AdamW, constant).
LEARNING_RATE = 1e-2


def add_parser(subcommands: Any) -> None:
    """Add ``demo`` to the ``onnxtrain`` parser's subcommands."""
    parser: Parser = subcommands.add_parser(
        "demo",
        help="train an MLP on scikit-learn's handwritten digits, end to end",
        description="Build a 64-64-10 MLP with onnxtrain's blocks, generate its training artifacts, train it on "
        "1,437 of scikit-learn's 8x8 handwritten digits, export it and report its accuracy on the other 360. "
        'Needs scikit-learn and matplotlib: pip install "onnxtrain[demo]".',
    )
    parser.add_argument(
        "--out", type=Path, default=Path("onnxtrain-demo"), metavar="DIR", help="where the files go (onnxtrain-demo)"
    )
    parser.add_argument("--epochs", type=count(1), default=30, metavar="N", help="default: 30")
    parser.add_argument("--batch-size", type=count(1), default=32, metavar="B", help="default: 32")
    parser.add_argument("--seed", type=count(0), default=0, metavar="S", help="the weights, split and order (0)")
    parser.set_defaults(run=run, prog=parser.prog)


def run(args: argparse.Namespace) -> int:
    """Run the demo; print the progress, the accuracy and the files written."""
    from onnxtrain.cli import digits

    digits.require_extras()
    import numpy as np
    import onnxruntime as ort

    from onnxtrain import artifacts
    from onnxtrain.cli.export import export_inference_model
    from onnxtrain.loop import ArtifactFiles, Settings, split, train, with_learning_rate

    out: Path = args.out.resolve()
    pixels, labels = digits.load()
    model = digits.forward_model(args.seed)
    built = artifacts.build_artifacts(
        model, requires_grad=[t.name for t in model.graph.initializer], loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW, additional_output_names=[model.graph.output[0].name],
    )  # fmt: skip  # the class scores as an output too: the loop reports the accuracy
    artifacts.write_artifacts(replace(built, checkpoint=with_learning_rate(built.checkpoint, LEARNING_RATE)), out)
    print(f"generated the training artifacts of a 64-64-10 MLP in {out}")
    files = ArtifactFiles(out)
    val_split = digits.HELD_OUT / len(pixels)
    settings = Settings(args.epochs, args.batch_size, args.seed, val_split)
    started = time.perf_counter()
    result = train(files, [pixels, labels], settings, restart=True, report_every=5, val_label="held-out")
    print(f"{result.steps} optimizer steps in {time.perf_counter() - started:.1f} s")
    exported = export_inference_model(files, out / "digits.onnx")
    _, held_out = split(len(pixels), val_split, args.seed)
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    predicted = session.run(None, {"pixels": pixels[held_out]})[0].argmax(axis=1)
    accuracy = float(np.mean(predicted == labels[held_out]))
    print(f"exported {exported.path.name}: accuracy on {len(held_out)} held-out digits {accuracy:.1%}")
    digits.plot_losses(result.record.history, out / "loss_curve.png")
    print(f"wrote {out}:")
    for path in sorted(out.iterdir()):
        if path.is_file():
            print(f"  {path.name} ({size_text(path.stat().st_size)})")
    print(f"next: onnxtrain inspect {args.out}")
    return 0


__all__ = ["LEARNING_RATE", "add_parser", "run"]
