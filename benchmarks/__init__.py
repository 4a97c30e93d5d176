"""Speed and peak memory of onnxtrain against PyTorch eager and onnxruntime-training 1.19.2.

``python -m benchmarks.run`` (``make bench``) prepares the workloads
(:mod:`benchmarks.workloads`, :mod:`benchmarks.prepare`), runs each framework on
each workload in its own process (:mod:`benchmarks.workers`) and prints the
table (:mod:`benchmarks.report`). See docs/benchmarks.md.

This package is imported by the onnxruntime-training worker too, which runs in
its own Python 3.11 environment without onnxtrain: keep this file, and the
modules that worker imports (:mod:`benchmarks.measure`,
:mod:`benchmarks.workers.ort_training_worker`), free of third-party imports at
module level.
"""
