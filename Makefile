# Two entry points: `make bench` (set up, then run the main job) and `make test`.
# Both create or reuse the virtualenv in $(VENV). Override the torch build with e.g.
#   make bench TORCH_SPEC="torch==2.6.0" TORCH_INDEX="--index-url <your PyTorch wheel index>"
# Tracking speed across commits (see docs/tracking.md):
#   make asv-check | asv-quick | asv-continuous BASE=<ref> HEAD_REF=<ref> | asv-report | asv-publish | gate
#   make gate-base BASE=<ref>   (this checkout against an earlier commit, alternating processes)
#   (asv-publish draws what asv-quick / asv-continuous saved: run one of them first)
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlgauge-installed

# asv continuous (the merge gate): each preset variant's training and acting CPU cost in units of a fixed
# yardstick (benchmarks/bench_relative.py: trainer slices alternate with slices of benchmarks/reference_work.py
# in one process per commit, so the machine's drifting speed cancels) and peak host memory; fails when one
# got worse by more than ASV_FACTOR. ASV_FACTOR comes from A/A runs of this command on a 2-core machine
# (docs/tracking.md: the largest A/A ratio, with a margin); planted 20 % same-thread slowdowns exceed it.
# Calibrate your runner's own with `rlgauge asv-calibrate` and set it here.
# The wall-time benchmarks (track_*, time_select_actions, Replay), the raw CPU-time ones and device
# memory: asv-report.
ASV_FACTOR ?= 1.12
ASV_GATED ?= RelativeCost|peakmem_
ASV_REPORTED ?= track_seconds_per_1k|time_select_actions|CpuTime|Replay|peak_device|track_instructions
BASE ?= HEAD~1
HEAD_REF ?= HEAD
# asv-counts (a merge gate): the deterministic cost counts per env step (benchmarks/bench_counts.py: aten
# ops, host syncs, float64 ops, output bytes, Python calls). The same code gives the same counts in every
# process on any load, so any increase beyond ASV_COUNT_FACTOR fails (a sync or a kernel added per step).
# Hardware instructions retired are not exact between processes: reported by asv-report, never gated.
ASV_COUNT_FACTOR ?= 1.001
ASV_COUNTS ?= CostCounts\.track_(acting_)?(aten_ops|host_syncs|float64_ops|output_bytes|python_calls)
# asv-quick files its results under this commit (ASV_QUICK_ARGS: more asv run options, e.g.
# -b time_insert_vector_step); asv-publish reads them from ASV_RESULTS (asv.conf.json's results_dir).
ASV_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
ASV_RESULTS ?= .asv/results
ASV_QUICK_ARGS ?=

# The quick gate: both variants interleaved in one process; optimized/baseline env steps/sec
# must not be confirmed below MIN_SPEEDUP, and every stability check must pass. One
# BLAS/OpenMP thread, as in the asv suite. Repeats, rounds and the max slowdown below are the
# settings `rlgauge calibrate ppo-cartpole` recommended on a 2-core machine (docs/analysis.md):
# 9 paired rounds of 2,048 env steps, a 10 % threshold.
GATE_PRESET ?= ppo-cartpole
MIN_SPEEDUP ?= 2.0
GATE_ARGS ?= --steps 2048 --repeats 9 --set run.warmup_steps=1024
GATE_OUT ?=

# The cross-commit gate: BASE (a git ref) checked out in a temporary worktree; its optimized
# variant and this checkout's are measured by alternating processes, rounds flipping the
# order; fails on a slowdown the interval confirms beyond gates.yaml's max_slowdown_pct.
GATE_BASE_ARGS ?= --steps 2048 --repeats 3 --set run.warmup_steps=1024 --rounds 9 --max-slowdown 10
GATE_BASE_OUT ?=

.PHONY: install bench test test-slow test-all asv-machine asv-check asv-quick asv-continuous asv-counts asv-report asv-publish gate gate-base reference-effects clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)" $(TORCH_INDEX)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

bench: install
	$(BIN)/rlgauge run ppo-cartpole

# `make test`: the suite without the `slow` checks (learning runs, real asv and gate runs), in
# two phases: tests marked `serial` compare absolute speed and run first, alone; then the rest
# with `pytest -n auto`. Work stealing: an idle worker takes tests queued on a busy one.
# `make test-slow`: the `slow` checks, in the same two phases. `make test-all`: both (CI runs both).
test: install
	$(BIN)/python -m pytest -m "serial and not slow"
	$(BIN)/python -m pytest -n auto --dist worksteal -m "not serial and not slow"

test-slow: install
	$(BIN)/python -m pytest -m "serial and slow"
	$(BIN)/python -m pytest -n auto --dist worksteal -m "slow and not serial"

test-all: test-slow test

asv-machine: install
	$(BIN)/asv machine --yes

asv-check: install
	$(BIN)/asv check --python=same

# --python=same runs in this environment, where asv saves results only under a commit hash:
# --set-commit-hash files them under HEAD (uncommitted changes are measured but filed as HEAD),
# so that asv-publish has something to draw.
asv-quick: asv-machine
	@test -n "$(ASV_COMMIT)" || { echo "asv-quick: needs a git checkout (results are filed under a commit)" >&2; exit 2; }
	@git diff --quiet HEAD || echo "asv-quick: uncommitted changes are measured but filed under HEAD ($(ASV_COMMIT))" >&2
	$(BIN)/asv run --quick --python=same --set-commit-hash $(ASV_COMMIT) $(ASV_QUICK_ARGS)

# A ref that is not a commit here stops make before any set-up, with one line (exit 2).
ifneq ($(filter asv-continuous asv-counts asv-report,$(MAKECMDGOALS)),)
  $(foreach ref,BASE HEAD_REF,$(if $(shell git rev-parse --verify --quiet '$($(ref))^{commit}' 2>/dev/null),,\
    $(error $(ref)=$($(ref)) is not a commit in this repository; give a branch, a tag, a commit hash or e.g. HEAD~1 (a shallow clone needs git fetch --unshallow))))
endif

# ASV_REPORT_ONLY=1: the same comparison, reported without failing (a runner whose factor nobody
# calibrated: the pull-request workflow unless the repository sets the variable ASV_FACTOR).
ASV_REPORT_ONLY ?=

# Then the cost counts of the same two commits (as asv-counts below), so that one command gates both;
# ASV_COUNTS_REPORT_ONLY=1 reports their changes without failing (a commit that adds work on purpose).
asv-continuous: asv-machine
	@status=0; \
	$(BIN)/asv continuous --factor $(ASV_FACTOR) -b '$(ASV_GATED)' $(BASE) $(HEAD_REF) || status=1; \
	$(BIN)/asv continuous --factor $(ASV_COUNT_FACTOR) -b '$(ASV_COUNTS)' $(BASE) $(HEAD_REF) || { \
		if [ -n "$(ASV_COUNTS_REPORT_ONLY)" ]; then echo "asv-continuous: the count changes above are reported, not failed (ASV_COUNTS_REPORT_ONLY=$(ASV_COUNTS_REPORT_ONLY))" >&2; else status=1; fi; }; \
	if [ $$status -ne 0 ] && [ -n "$(ASV_REPORT_ONLY)" ]; then \
		echo "asv-continuous: report only (ASV_REPORT_ONLY=$(ASV_REPORT_ONLY)): asv's verdict above does not fail the run" >&2; status=0; fi; \
	exit $$status

asv-counts: asv-machine
	$(BIN)/asv continuous --factor $(ASV_COUNT_FACTOR) -b '$(ASV_COUNTS)' $(BASE) $(HEAD_REF) $(if $(ASV_REPORT_ONLY),\
		|| echo "asv-counts: report only (ASV_REPORT_ONLY=$(ASV_REPORT_ONLY)): the count changes above do not fail the run" >&2)

# The wall-time benchmarks across the same two commits, reported, never failing: asv judges their
# track_ values by the factor alone and their wall time moves with the machine's other load.
asv-report: asv-machine
	-$(BIN)/asv continuous --factor $(ASV_FACTOR) -b '$(ASV_REPORTED)' $(BASE) $(HEAD_REF)

# Refuses to write an empty site: publish needs saved results (asv-quick, asv run or asv-continuous).
asv-publish: install
	@ls $(ASV_RESULTS)/*/*-*.json >/dev/null 2>&1 || { echo "asv-publish: no saved results in $(ASV_RESULTS)/; run make asv-quick first" >&2; exit 2; }
	$(BIN)/asv publish

gate: install
	OMP_NUM_THREADS=1 $(BIN)/rlgauge gate --run $(GATE_PRESET) --min-speedup $(MIN_SPEEDUP) $(GATE_ARGS) --quiet \
		$(if $(GATE_OUT),--out $(GATE_OUT))

gate-base: install
	OMP_NUM_THREADS=1 $(BIN)/rlgauge gate --base $(BASE) --run $(GATE_PRESET) $(GATE_BASE_ARGS) \
		$(if $(GATE_BASE_OUT),--out $(GATE_BASE_OUT))

# The reference figures diagnose quotes (harness/diagnosis/reference_effects.json): ablate on the shipped CPU
# presets from a clean commit, on a quiet machine. Both write to a copy, so the second measures a clean tree too;
# an entry of a busy machine or of uncommitted code is kept in the file but never quoted (docs/analysis.md).
REFERENCE_EFFECTS ?= harness/diagnosis/reference_effects.json
reference-effects: install
	@git diff --quiet HEAD || { echo "reference-effects: uncommitted changes; measure a clean commit (diagnose never quotes an entry of uncommitted code)" >&2; exit 2; }
	@work=$$(mktemp -d) && cp $(REFERENCE_EFFECTS) $$work/effects.json && \
	$(BIN)/rlgauge ablate ppo-cartpole --device cpu --repeats 15 --effects $$work/effects.json && \
	$(BIN)/rlgauge ablate dqn-cartpole --device cpu --repeats 15 --effects $$work/effects.json && \
	cp $$work/effects.json $(REFERENCE_EFFECTS) && rm -rf $$work

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis *.egg-info .asv
