"""Inference latency: one batched action selection for ``num_envs`` observations (host in,
env-ready actions out, host<->device copies included), as the trainer does it each step."""

from __future__ import annotations

from reference_trainers.runtime import device as dev

from .common import PARAM_NAMES, PARAMS, build, observations, skip_unless_available


class InferenceLatency:
    params = PARAMS
    param_names = PARAM_NAMES
    timeout = 120
    warmup_time = 0.2

    def setup(self, preset: str, variant: str, device: str) -> None:
        skip_unless_available(device)
        self.saved = dev.process_settings()
        self.trainer = build(preset, variant, device)
        self.device = self.trainer.device
        self.obs = observations(self.trainer.config.env.id, self.trainer.num_envs)

    def teardown(self, preset: str, variant: str, device: str) -> None:
        if hasattr(self, "trainer"):  # asv calls teardown after a skipping setup too
            self.trainer.close()
            dev.restore_process_settings(self.saved)

    def time_select_actions(self, preset: str, variant: str, device: str) -> None:
        self.trainer.select_actions(self.obs)
        dev.synchronize(self.device)
