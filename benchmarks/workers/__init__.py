"""One worker per framework, each run as ``python -m benchmarks.workers.<framework>_worker {generate,train} ...``.

``generate`` writes the framework's training artifacts (the ONNX frameworks);
``train`` loads them and times the steps, in a fresh process so that its peak
memory is its own. :mod:`benchmarks.workers.ort_training_worker` runs in the
onnxruntime-training environment: it imports neither onnxtrain nor torch
itself (``onnxruntime.training`` does import torch).
"""
