# Two entry points: `make bench` (set up, then run the main job) and `make test`.
# Both create or reuse the virtualenv in $(VENV). Override the torch build with e.g.
#   make bench TORCH_SPEC="torch==2.6.0" TORCH_INDEX="--index-url <your PyTorch wheel index>"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlgauge-installed

.PHONY: install bench test test-fast clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

bench: install
	$(BIN)/rlgauge run ppo-cartpole

test: install
	$(BIN)/python -m pytest -n auto

test-fast: install
	$(BIN)/python -m pytest -n auto -m "not slow"

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info
