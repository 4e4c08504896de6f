# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup demo test test-gpu bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# the CPU build of torch first (on local disk); a plain `torch` would pull a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

# the synthetic log drifts at step 300 (four features get 128 ids per example): the live reshard at
# step 500 has an unbalanced plan to fix (docs/reshard.md, "The demo")
demo: setup
	$(PY) -m shardwise train --drift-at 300

test: setup
	$(PY) -m pytest -q -x --timeout=600 tests

# the GPU-capable tests (marker `gpu`) on CUDA/NCCL, one GPU per rank (tests needing more ranks than
# GPUs are skipped with the reason); needs a CUDA build of torch
test-gpu: setup
	SHARDWISE_TEST_DEVICE=cuda $(PY) -m pytest -q -rs --timeout=600 -m gpu tests

bench: setup
	$(PY) -m shardwise bench

clean:
	rm -rf $(VENV) build *.egg-info
