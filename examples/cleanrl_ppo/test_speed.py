"""The example's speed gate, run by pytest with rlgauge's plugin (``pip install rlgauge`` registers it).

``pytest examples/cleanrl_ppo`` measures both variants of ``bench.yaml`` interleaved in one process
and fails when the optimised one is not at least MIN_SPEEDUP times the baseline, as ``rlgauge gate
--run bench.yaml --min-speedup 1.2`` would; on a machine too busy for a verdict the test is skipped
with the reason.
"""

from pathlib import Path

BENCH = Path(__file__).with_name("bench.yaml")
MIN_SPEEDUP = 1.2


def test_optimized_is_faster_than_baseline(rlgauge):
    rlgauge.assert_speedup(BENCH, min_speedup=MIN_SPEEDUP)
