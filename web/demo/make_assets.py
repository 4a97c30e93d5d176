"""The demo's files: the digits MLP's artifacts by ``onnxtrain generate`` and scikit-learn's digits as one small file.

What docs/web.md shows, run for real: `make web-demo` and the browser test (web/test/browser.test.js) call it.

    python web/demo/make_assets.py [OUT]      # default: web/demo/assets

Writes ``OUT/model.onnx`` (``onnxtrain demo``'s 64-64-10 MLP, seed 0), the
artifacts in ``OUT/artifacts/`` (cross-entropy, AdamW, learning rate 0.01
stored in the checkpoint), ``OUT/digits.bin`` (the 1,797 digits in a fixed
shuffled order: float32 pixels [N, 64] in [0, 1], then uint8 labels [N]) and
``OUT/digits.json`` (the counts: the first ``train`` rows train, the rest are
held out). The page trains in batches of ``batchSize`` rows in file order.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

HELD_OUT = 360
BATCH_SIZE = 32
LEARNING_RATE = 0.01
SEED = 0


def digits_in_order() -> tuple[np.ndarray, np.ndarray]:
    """The digits (pixels float32 [N, 64], labels int64 [N]) in the demo's order: shuffled with seed 0."""
    from onnxtrain.cli.digits import load

    pixels, labels = load()
    order = np.random.default_rng(SEED).permutation(len(pixels))
    return pixels[order], labels[order]


def make(out: Path) -> None:
    from onnxtrain.cli.digits import forward_model

    out.mkdir(parents=True, exist_ok=True)
    onnx.save(forward_model(SEED), out / "model.onnx")
    command = [sys.executable, "-m", "onnxtrain", "generate", str(out / "model.onnx"), "--requires-grad", "weights"]
    command += ["--loss", "ce", "--optimizer", "adamw", "--lr", str(LEARNING_RATE), "-o", str(out / "artifacts")]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    pixels, labels = digits_in_order()
    with open(out / "digits.bin", "wb") as file:
        file.write(pixels.astype("<f4").tobytes())
        file.write(labels.astype(np.uint8).tobytes())
    manifest = {
        "count": len(pixels),
        "train": len(pixels) - HELD_OUT,
        "features": 64,
        "classes": 10,
        "batchSize": BATCH_SIZE,
    }
    (out / "digits.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    make(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "assets")
