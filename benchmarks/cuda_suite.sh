#!/usr/bin/env bash
# The CUDA check of a machine with an NVIDIA GPU: the test suite (its CUDA tests run there and are skipped
# elsewhere), then each named preset measured on cuda, one at a time, each result in OUT/runs/PRESET.json.
#   bash benchmarks/cuda_suite.sh OUT [--budget SECONDS] [--tests|--no-tests|--tests-from FILE] [PRESET[:ARGS]...]
# --tests-from FILE: only the test files or node ids FILE lists, one a line (e.g. the files with CUDA tests).
# --pack: at the end, everything under OUT in one file, OUT/cuda_suite.tar.gz (for a copy-back that limits files).
# PRESET:ARGS passes more `rlgauge run` options, e.g. ppo-cartpole-gpu:--steps=32768. No preset named:
# every preset. The budget (default 3600 s) bounds the whole script: a preset starts only while at
# least 60 s of it remain, and is stopped at its end. OUT/summary.txt lists what ran and how it ended;
# record the runs in RUNS.md with `rlgauge record --milestone NAME OUT/runs/*.json`.
set -u
OUT=${1:?usage: cuda_suite.sh OUT [--budget S] [--no-tests|--tests-from FILE] [PRESET[:ARGS]...]}
shift
BUDGET=3600
TESTS=1
TEST_ARGS=()
PACK=0
PY=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case $1 in
    --budget) BUDGET=$2; shift 2 ;;
    --no-tests) TESTS=0; shift ;;
    --tests) TESTS=1; shift ;;
    --pack) PACK=1; shift ;;
    --tests-from) TESTS=1; mapfile -t TEST_ARGS < <(grep -v '^\s*$' "$2"); shift 2 ;;
    *) break ;;
  esac
done
PRESETS=("$@")
if [ ${#PRESETS[@]} -eq 0 ]; then
  mapfile -t PRESETS < <(ls harness/specs/presets/*.yaml | xargs -n1 basename | sed 's/\.yaml$//')
fi
mkdir -p "$OUT/runs"
SUMMARY=$OUT/summary.txt
deadline=$((SECONDS + BUDGET))
left() { echo $((deadline - SECONDS)); }

{ nvidia-smi -L; "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"; } >>"$SUMMARY" 2>&1

if [ "$TESTS" = 1 ]; then
  start=$SECONDS
  timeout $(( $(left) - 60 )) "$PY" -m pytest -q -n "$(nproc)" --dist worksteal -m "not slow and not serial" -p no:cacheprovider \
    -rfE --junitxml="$OUT/tests.xml" "${TEST_ARGS[@]}" >"$OUT/tests.log" 2>&1
  echo "tests: exit $? after $((SECONDS - start)) s: $(tail -1 "$OUT/tests.log")" >>"$SUMMARY"
fi

for item in "${PRESETS[@]}"; do
  preset=${item%%:*}
  extra=()
  [ "$item" != "$preset" ] && IFS=',' read -r -a extra <<<"${item#*:}"
  if [ "$(left)" -lt 60 ]; then
    echo "$preset: not run (budget spent)" >>"$SUMMARY"
    continue
  fi
  start=$SECONDS
  timeout "$(left)" "$PY" -m harness run "$preset" --device cuda --quiet "${extra[@]}" \
    --out "$OUT/runs/$preset.json" >"$OUT/runs/$preset.log" 2>&1
  echo "$preset: exit $? after $((SECONDS - start)) s ${extra[*]}" >>"$SUMMARY"
done
cat "$SUMMARY"
if [ "$PACK" = 1 ]; then
  packed=$(mktemp) && tar czf "$packed" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$packed" "$OUT/cuda_suite.tar.gz"
fi
