# Set-up and entry points. `make demo` and `make test` each create the virtual
# environment in .venv on first use (or when pyproject.toml changes).
#
# `make test` runs the suite twice: in .venv with the newest releases pip finds,
# then in .venv-oldest with the oldest the project supports (onnx and
# onnxruntime pinned by constraints-oldest.txt, pyproject.toml's lower bounds).
# `make test-newest` and `make test-oldest` run one pass each.
#
# `make test` also runs onnxtrain-web's tests (web/, docs/web.md): `make test-web`
# installs Debian's chromium where $(CHROMIUM) is missing, the node modules with
# `npm ci` from web/package-lock.json, then runs the Node.js tests (onnxruntime-node)
# and the browser test (headless Chromium, onnxruntime-web), both against the
# Python runtime in .venv. `make web-demo` serves the demo page on localhost.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
# pytest's arguments: the suite over every core (pytest-xdist); the MPI tests, which start processes of their
# own, stay on one worker (their xdist_group). PYTEST_ARGS=-n0 runs it in one process.
PYTEST_ARGS ?= -n auto --dist loadgroup
# onnxruntime-training, frozen at 1.19.2, for the checkpoint interop tests. It
# conflicts with onnxruntime and ships wheels for CPython <= 3.11 only, so it
# lives in its own environment, built with the newest such Python found.
ORT_TRAINING_VENV ?= .venv-ort-training
ORT_TRAINING_PYTHON ?= $(shell for p in python3.11 python3.10 python3.9 python3.8; do command -v $$p && break; done)
ORT_TRAINING_PACKAGES ?= onnxruntime-training-cpu==1.19.2 onnx==1.16.2 "numpy<2"

# The oldest supported releases, for the second pass: the same Python and extras,
# onnx and onnxruntime at the versions constraints-oldest.txt pins.
OLDEST_VENV ?= .venv-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
OLDEST_CONSTRAINTS ?= constraints-oldest.txt

.PHONY: demo test test-newest test-oldest test-web web-demo web-deps chromium bench bench-web venv venv-oldest torch torch-oldest ort-training clean

demo: venv
	$(BIN)/onnxtrain demo

test: test-newest test-oldest test-web

test-newest: venv torch ort-training
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-oldest: venv-oldest torch-oldest ort-training
	$(OLDEST_BIN)/python -m pytest $(PYTEST_ARGS)

# onnxtrain-web (web/): Debian's chromium for the browser test, installed with apt
# where it is missing (sudo unless root); the node modules as the lock file pins them.
CHROMIUM ?= /usr/bin/chromium
WEB_DEMO_PORT ?= 8000
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

test-web: venv web-deps chromium
	cd web && ONNXTRAIN_PYTHON="$(abspath $(BIN))/python" CHROMIUM="$(CHROMIUM)" npm test

# The demo page on http://127.0.0.1:$(WEB_DEMO_PORT)/demo/: its artifacts (onnxtrain generate)
# and data file are made in web/demo/assets when missing.
web-demo: venv web-deps
	@test -f web/demo/assets/digits.json || $(BIN)/python web/demo/make_assets.py web/demo/assets
	cd web && ONNXTRAIN_PYTHON="$(abspath $(BIN))/python" PORT=$(WEB_DEMO_PORT) npm run demo

# A training step of the digits MLP in Node.js, headless Chromium and Python (benchmarks/web, docs/benchmarks.md).
bench-web: venv web-deps chromium
	cd web && ONNXTRAIN_PYTHON="$(abspath $(BIN))/python" CHROMIUM="$(CHROMIUM)" npm run bench

web-deps: web/node_modules/.installed

# ONNXRUNTIME_NODE_INSTALL=skip: onnxruntime-node's install script would fetch CUDA libraries; its CPU
# library is in the package.
web/node_modules/.installed: web/package.json web/package-lock.json
	cd web && ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error
	touch $@

chromium:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	    echo "installing Debian's chromium for the browser test (apt-get)"; \
	    $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium > /dev/null; \
	fi

# The benchmark (benchmarks/, docs/benchmarks.md): onnxtrain, PyTorch eager and
# onnxruntime-training 1.19.2; the last in its own environment,
# benchmarks/.venv-ort-training, created on first use. Not part of `make test`.
# BENCH_ARGS: e.g. --quick, --workloads mlp, --markdown out.md.
bench: venv torch
	$(BIN)/python -m benchmarks.ort_venv
	$(BIN)/python -m benchmarks.run $(BENCH_ARGS)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[test,mpi]"
	touch $@

# Made anew when pyproject.toml or the pins change, so that nothing newer stays.
venv-oldest: $(OLDEST_VENV)/.installed

$(OLDEST_VENV)/.installed: pyproject.toml $(OLDEST_CONSTRAINTS)
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_BIN)/python -m pip install -q --disable-pip-version-check -e ".[test,mpi]" -c $(OLDEST_CONSTRAINTS)
	touch $@

# torch is optional: the tests that compare with it skip without it. It is
# installed only when a CPU wheel is available without an index (a local wheel
# folder configured for pip); never the multi-gigabyte CUDA build.
# $(call install-torch,VENV): into that environment.
define install-torch
	@if $(1)/bin/python -c "import torch" 2>/dev/null; then :; \
	elif $(1)/bin/python -m pip download -q --no-deps --no-index --only-binary=:all: \
	        -d $(1)/wheels "torch==$(TORCH_VERSION)" >/dev/null 2>&1; then \
	    $(1)/bin/python -m pip install -q --disable-pip-version-check "torch==$(TORCH_VERSION)"; \
	else echo "torch $(TORCH_VERSION) has no local CPU wheel here: the comparisons with torch will be skipped"; fi
endef

torch: venv
	$(call install-torch,$(VENV))

torch-oldest: venv-oldest
	$(call install-torch,$(OLDEST_VENV))

# The interop tests (tests/checkpoint/test_ort_interop.py) run ORT in this
# environment. Where it cannot be built, the reason goes to UNAVAILABLE and the
# tests skip with it instead of failing; `make clean` retries.
ort-training: $(ORT_TRAINING_VENV)/.done

$(ORT_TRAINING_VENV)/.done:
	@rm -rf $(ORT_TRAINING_VENV)
	@if [ -z "$(ORT_TRAINING_PYTHON)" ]; then \
	    mkdir -p $(ORT_TRAINING_VENV); \
	    echo "no CPython 3.8-3.11 found; onnxruntime-training 1.19.2 has no wheel for newer versions" > $(ORT_TRAINING_VENV)/UNAVAILABLE; \
	elif ! $(ORT_TRAINING_PYTHON) -m venv $(ORT_TRAINING_VENV) > /dev/null 2>&1; then \
	    mkdir -p $(ORT_TRAINING_VENV); \
	    echo "$(ORT_TRAINING_PYTHON) -m venv failed" > $(ORT_TRAINING_VENV)/UNAVAILABLE; \
	elif ! $(ORT_TRAINING_VENV)/bin/python -m pip install -q --disable-pip-version-check \
	        $(ORT_TRAINING_PACKAGES) > $(ORT_TRAINING_VENV)/install.log 2>&1; then \
	    echo "pip could not install $(ORT_TRAINING_PACKAGES) for $(ORT_TRAINING_PYTHON): $$(tail -n 1 $(ORT_TRAINING_VENV)/install.log)" \
	        > $(ORT_TRAINING_VENV)/UNAVAILABLE; \
	elif ! $(ORT_TRAINING_VENV)/bin/python -c "import onnxruntime.capi._pybind_state as C; C.load_checkpoint" \
	        >> $(ORT_TRAINING_VENV)/install.log 2>&1; then \
	    echo "onnxruntime-training installed but does not import: $$(tail -n 1 $(ORT_TRAINING_VENV)/install.log)" \
	        > $(ORT_TRAINING_VENV)/UNAVAILABLE; \
	fi
	@if [ -f $(ORT_TRAINING_VENV)/UNAVAILABLE ]; then \
	    echo "ort-training: $$(cat $(ORT_TRAINING_VENV)/UNAVAILABLE); the ORT interop tests will be skipped"; fi
	@touch $@

clean:
	rm -rf $(VENV) $(OLDEST_VENV) $(ORT_TRAINING_VENV) benchmarks/.venv-ort-training .pytest_cache .hypothesis \
	    web/node_modules web/demo/assets
