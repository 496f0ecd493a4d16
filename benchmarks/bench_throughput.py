"""Training throughput of each preset variant, tracked across commits.

asv treats lower as better, so ``track_env_steps_per_sec`` (higher is better, for reading)
has a lower-is-better twin, ``track_seconds_per_1k_env_steps``, for regression detection.
"""

from __future__ import annotations

from harness.presets import specs_for
from harness.runner import run_variants
from reference_trainers.common import device as dev

DEVICES = {"cpu": lambda: True, "cuda": dev.cuda_available, "mps": dev.mps_available}
SHORT_RUN = ["run.steps=4096", "run.warmup_steps=1024", "run.repeats=1", "run.latency_samples=20"]


class Throughput:
    params = (["ppo-cartpole"], ["baseline", "optimized"], ["cpu", "cuda", "mps"])
    param_names = ["preset", "variant", "device"]
    timeout = 300
    number = 1
    repeat = 1

    def setup(self, preset: str, variant: str, device: str) -> None:
        if not DEVICES[device]():
            raise NotImplementedError(f"{device} is not available here")  # asv: skip
        specs = specs_for(preset, variant, SHORT_RUN + [f"device={device}"])
        (self.result,), _ = run_variants(specs, say=lambda _text: None)

    def track_env_steps_per_sec(self, preset: str, variant: str, device: str) -> float:
        return self.result.metrics["env_steps_per_sec"]["median"]

    track_env_steps_per_sec.unit = "steps/s"

    def track_seconds_per_1k_env_steps(self, preset: str, variant: str, device: str) -> float:
        return 1000.0 / self.result.metrics["env_steps_per_sec"]["median"]

    track_seconds_per_1k_env_steps.unit = "s"
