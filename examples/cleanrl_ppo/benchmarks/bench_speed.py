"""asv benchmarks of the example trainer: env steps/sec (and its lower-is-better twin), CPU seconds
per 1k env steps and peak memory of both variants in bench.yaml, from one interleaved run."""

from pathlib import Path

from harness.integrations.asv_helpers import trainer_benchmarks

BENCH = Path(__file__).resolve().parents[1] / "bench.yaml"

TrainerSpeed = trainer_benchmarks(str(BENCH), name="TrainerSpeed")
