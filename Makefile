# Set-up and entry points. `make demo` and `make test` each create the virtual
# environment in .venv on first use (or when pyproject.toml changes).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: demo test venv torch clean

demo: venv
	$(BIN)/python examples/custom_loss.py

test: venv torch
	$(BIN)/python -m pytest $(PYTEST_ARGS)

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[test]"
	touch $@

# torch is optional: the tests that compare with it skip without it. It is
# installed only when a CPU wheel is available without an index (a local wheel
# folder configured for pip); never the multi-gigabyte CUDA build.
torch: venv
	@if $(BIN)/python -c "import torch" 2>/dev/null; then :; \
	elif $(BIN)/python -m pip download -q --no-deps --no-index --only-binary=:all: \
	        -d $(VENV)/wheels "torch==$(TORCH_VERSION)" >/dev/null 2>&1; then \
	    $(BIN)/python -m pip install -q --disable-pip-version-check "torch==$(TORCH_VERSION)"; \
	else echo "torch $(TORCH_VERSION) has no local CPU wheel here: the comparisons with torch will be skipped"; fi

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
