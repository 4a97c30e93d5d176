"""Real-size models (GPT-2 small, a Llama-style 125M): onnxtrain against PyTorch eager, and the static memory.

``python -m benchmarks.real_size`` (:mod:`benchmarks.real_size.__main__`) runs
it; :mod:`~benchmarks.real_size.models` builds and exports the models,
:mod:`~benchmarks.real_size.worker` trains one framework per process,
:mod:`~benchmarks.real_size.memory` reads what a process holds,
:mod:`~benchmarks.real_size.static` analyses the training graphs and
:mod:`~benchmarks.real_size.report` writes the tables. See docs/benchmarks.md,
"Real-size models".
"""
