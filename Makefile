# Two entry points: `make bench` (set up, then run the main job) and `make test`.
# Both create or reuse the virtualenv in $(VENV). Override the torch build with e.g.
#   make bench TORCH_SPEC="torch==2.6.0" TORCH_INDEX="--index-url <your PyTorch wheel index>"
# Tracking speed across commits (see docs/tracking.md):
#   make asv-check | asv-quick | asv-continuous BASE=<ref> HEAD_REF=<ref> | asv-publish | gate
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlgauge-installed

# asv continuous: fail when a lower-is-better benchmark got worse by more than ASV_FACTOR.
# ASV_GATED leaves out track_env_steps_per_sec / track_updates_per_sec (higher is better:
# asv would call a speedup a regression); track_seconds_per_1k_env_steps is their twin.
ASV_FACTOR ?= 1.3
ASV_GATED ?= seconds_per_1k|time_|peakmem_|peak_device
BASE ?= HEAD~1
HEAD_REF ?= HEAD

# The quick gate: both variants interleaved in one process; optimized/baseline env steps/sec
# must not be confirmed below MIN_SPEEDUP, and every stability check must pass. One
# BLAS/OpenMP thread, as in the asv suite.
GATE_PRESET ?= ppo-cartpole
MIN_SPEEDUP ?= 2.0
GATE_ARGS ?= --steps 2048 --repeats 9 --set run.warmup_steps=1024
GATE_OUT ?=

.PHONY: install bench test test-fast asv-machine asv-check asv-quick asv-continuous asv-publish gate clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

bench: install
	$(BIN)/rlgauge run ppo-cartpole

# Tests marked `serial` measure absolute speed (asv across commits): they run first, alone,
# then everything else in parallel (its summary closes the log).
test: install
	$(BIN)/python -m pytest -m serial
	$(BIN)/python -m pytest -n auto -m "not serial"

test-fast: install
	$(BIN)/python -m pytest -n auto -m "not slow"

asv-machine: install
	$(BIN)/asv machine --yes

asv-check: install
	$(BIN)/asv check --python=same

asv-quick: asv-machine
	$(BIN)/asv run --quick --python=same

asv-continuous: asv-machine
	$(BIN)/asv continuous --factor $(ASV_FACTOR) -b '$(ASV_GATED)' $(BASE) $(HEAD_REF)

asv-publish: install
	$(BIN)/asv publish

gate: install
	OMP_NUM_THREADS=1 $(BIN)/rlgauge gate --run $(GATE_PRESET) --min-speedup $(MIN_SPEEDUP) $(GATE_ARGS) --quiet \
		$(if $(GATE_OUT),--out $(GATE_OUT))

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info .asv
