"""The Stable-Baselines3 peer: the matching table, the SB3 models it builds, the trainer protocol, ``--peer``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("stable_baselines3")

from conftest import TINY  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.errors import UserError  # noqa: E402
from harness.measurement.metrics import TimingProbe  # noqa: E402
from harness.specs.peers import load_peer  # noqa: E402
from harness import Trainer  # noqa: E402
from harness.specs.peers.sb3 import make_trainer, matching, peer_settings  # noqa: E402
from harness.specs.presets import specs_for  # noqa: E402
from reference_trainers.config.resolve import resolve_config  # noqa: E402

TINY_SETS = [a for item in TINY for a in ("--set", item)]
DQN_TINY = ["device=cpu", "dqn.learning_starts=32", "dqn.batch_size=16", "dqn.log_interval=64",
            "run.warmup_steps=0", "run.steps=128", "run.repeats=1", "run.latency_samples=5"]



def resolution(preset: str, overrides: list[str]):  # noqa: ANN201
    return resolve_config(specs_for(preset, "baseline", overrides)[0].config)


def table(preset: str, overrides: list[str]) -> dict[str, object]:
    return {m.sb3: m.sb3_value for m in matching(resolution(preset, overrides).config)}


def test_ppo_matching_maps_minibatches_to_batch_size_and_the_network() -> None:
    args = table("ppo-cartpole-sb3", ["device=cpu"])
    assert (args["n_envs"], args["n_steps"], args["n_epochs"], args["batch_size"]) == (4, 128, 4, 128)
    assert args["policy_kwargs.net_arch"] == {"pi": [64, 64], "vf": [64, 64]}
    assert args["policy_kwargs.activation_fn"] == "Tanh" and args["clip_range_vf"] is None
    assert table("ppo-cartpole-sb3", ["device=cpu", "env.num_envs=64"])["batch_size"] == 64 * 128 // 4


def test_dqn_matching_converts_target_interval_to_env_transitions() -> None:
    args = table("dqn-cartpole-sb3", ["device=cpu"])
    assert (args["buffer_size"], args["batch_size"], args["train_freq"]) == (10_000, 128, (10, "step"))
    assert args["target_update_interval"] == 500  # 50 optimiser steps x 10 env steps each


def _orthogonal(layer: torch.nn.Linear, gain: float) -> bool:
    w = layer.weight.detach()
    gram = w.T @ w if w.shape[0] >= w.shape[1] else w @ w.T
    return bool(torch.allclose(gram, gain**2 * torch.eye(gram.shape[0]), atol=1e-4)) and not layer.bias.any()


def test_the_sb3_ppo_model_has_our_configs_values_field_by_field() -> None:
    c = resolution("ppo-cartpole-sb3", ["device=cpu"]).config
    trainer = make_trainer(peer_settings(c), device="cpu", seed=c.seed)
    try:
        m, p = trainer.model, c.ppo
        assert (m.n_envs, m.n_steps, m.n_epochs) == (c.env.num_envs, p.num_steps, p.update_epochs)
        assert m.batch_size == c.env.num_envs * p.num_steps // p.num_minibatches
        assert (m.gamma, m.gae_lambda, m.ent_coef, m.normalize_advantage) == (p.gamma, p.gae_lambda, p.ent_coef,
                                                                              p.norm_adv)
        assert m.vf_coef == p.vf_coef / 2  # ours: vf_coef x 0.5 x squared error; SB3: vf_coef x squared error
        assert m.clip_range(1.0) == m.clip_range(0.0) == p.clip_coef and m.clip_range_vf is None and not p.clip_vloss
        assert not p.anneal_lr and m.lr_schedule(1.0) == m.lr_schedule(0.1) == p.learning_rate
        assert m.max_grad_norm == c.stability.max_grad_norm
        assert m.policy.optimizer.param_groups[0]["eps"] == p.adam_eps
        assert m.policy.ortho_init is (c.model.init == "orthogonal")
        hidden = [l for l in m.policy.mlp_extractor.value_net if isinstance(l, torch.nn.Linear)]
        assert [l.out_features for l in hidden] == c.model.hidden_sizes and _orthogonal(hidden[0], 2**0.5)
        assert _orthogonal(m.policy.action_net, 0.01) and _orthogonal(m.policy.value_net, 1.0)
    finally:
        trainer.close()


def test_the_sb3_dqn_model_has_our_configs_values_field_by_field() -> None:
    c = resolution("dqn-cartpole-sb3", ["device=cpu"]).config
    trainer = make_trainer(peer_settings(c), device="cpu", seed=c.seed)
    try:
        m, d = trainer.model, c.dqn
        assert (m.buffer_size, m.batch_size, m.learning_starts, m.gradient_steps) == (
            d.buffer_size, d.batch_size, d.learning_starts, d.gradient_steps)
        assert (m.train_freq.frequency, m.tau, m.gamma, m.max_grad_norm) == (
            d.train_frequency, d.tau, d.gamma, c.stability.max_grad_norm)
        assert m.target_update_interval == d.target_update_interval * d.train_frequency * c.env.num_envs
        assert m.learning_rate == d.learning_rate and m.policy.optimizer.param_groups[0]["eps"] == d.adam_eps
        assert (m.exploration_initial_eps, m.exploration_final_eps) == (d.start_epsilon, d.end_epsilon)
        assert m.exploration_fraction * m._total_timesteps == pytest.approx(d.exploration_steps)
        linears = [l for l in m.q_net.q_net if isinstance(l, torch.nn.Linear)]
        assert [l.out_features for l in linears[:-1]] == c.model.hidden_sizes
        assert c.model.init == "torch_default" and not _orthogonal(linears[0], 2**0.5) and linears[0].bias.any()
    finally:
        trainer.close()


def test_model_init_torch_default_builds_our_q_network_as_sb3_does() -> None:
    from reference_trainers import build_trainer

    for init, orthogonal in (("orthogonal", True), ("torch_default", False)):
        trainer = build_trainer(resolution("dqn-cartpole-sb3", ["device=cpu", f"model.init={init}"]))
        try:
            first = next(l for l in trainer.model.modules() if isinstance(l, torch.nn.Linear))
            assert _orthogonal(first, 2**0.5) is orthogonal
        finally:
            trainer.close()


@pytest.mark.parametrize("preset, overrides, message", [
    ("ppo-cartpole-sb3", ["ppo.clip_vloss=true"], "ppo.clip_vloss=true has no SB3 counterpart"),
    ("dqn-cartpole-sb3", ["model.init=orthogonal"], "model.init=orthogonal has no SB3 DQN counterpart"),
    ("dqn-cartpole", [], "dqn.double_q=True has no SB3 DQN counterpart"),
    ("dqn-cartpole-sb3", ["dqn.n_step=3"], "dqn.n_step=3 has no SB3 DQN counterpart"),
    ("iqn-cartpole", [], "no SB3 counterpart for algo 'iqn'"),
])
def test_settings_without_an_sb3_counterpart_are_refused(preset: str, overrides: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        matching(resolution(preset, ["device=cpu", *overrides]).config)


def test_built_ppo_model_has_the_matched_settings_and_iterates_a_rollout() -> None:
    probe = TimingProbe()
    probe.enabled = True
    settings = peer_settings(resolution("ppo-cartpole-sb3", ["device=cpu", "ppo.num_steps=16"]).config)
    assert json.loads(json.dumps(settings)) == settings  # plain data, as a user's YAML config is
    trainer = make_trainer(settings, device="cpu", seed=1, probe=probe)
    try:
        assert isinstance(trainer, Trainer)  # the public contract a user's trainer follows
        m = trainer.model
        assert (m.n_steps, m.batch_size, m.n_epochs, m.n_envs) == (16, 16, 4, 4)
        linears = [layer for layer in m.policy.mlp_extractor.policy_net if isinstance(layer, torch.nn.Linear)]
        assert [layer.out_features for layer in linears] == [64, 64]
        assert isinstance(m.policy.mlp_extractor.policy_net[1], torch.nn.Tanh)
        assert m.policy.optimizer.param_groups[0]["eps"] == 1e-5
        done = trainer.iterate()
        assert (done.env_steps, done.updates) == (64, 16) and m._n_updates == 4
        totals = probe.totals()
        assert totals["env"] > 0 and totals["inference"] > 0 and totals["update"] > 0
    finally:
        trainer.close()


def test_built_dqn_model_trains_every_train_frequency_steps() -> None:
    trainer = make_trainer(peer_settings(resolution("dqn-cartpole-sb3", DQN_TINY).config), device="cpu", seed=1)
    try:
        m = trainer.model
        assert (m.target_update_interval, m.train_freq.frequency, m.buffer_size) == (500, 10, 10_000)
        first = trainer.iterate()   # 64 steps: learning starts after 32, trains every 10 steps
        assert first.env_steps >= 64 and first.updates == m._n_updates > 0
    finally:
        trainer.close()


def test_run_with_peer_prints_matching_and_ratios_and_records_three_runs(capsys: pytest.CaptureFixture[str],
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main(["run", "ppo-cartpole-sb3", *TINY_SETS, "--repeats", "2", "--peer", "sb3", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "hyper-parameters matched with sb3" in stdout and "n_epochs" in stdout
    assert "ratio to sb3" in stdout and "ours optimized" in stdout
    runs = json.loads(out.read_text(encoding="utf-8"))["runs"]
    assert [r["variant"] for r in runs] == ["baseline", "optimized", "sb3"]
    assert all(r["status"] == "ok" and len(r["metrics"]["env_steps_per_sec"]["samples"]) == 2 for r in runs)
    peer = runs[2]  # built through the public contract, as a user's own trainer
    assert peer["algo"] == "custom" and peer["config"]["trainer"] == "harness.specs.peers.sb3:make_trainer"
    assert peer["config"]["config"]["sb3"]["n_epochs"] == runs[0]["config"]["ppo"]["update_epochs"]


@pytest.mark.parametrize("argv, message", [
    (["ppo-cartpole", "--peer", "sb4"], "--peer 'sb4': unknown peer; accepted: sb3"),
    (["iqn-cartpole", "--peer", "sb3"], "no SB3 counterpart for algo 'iqn'"),
    (["dqn-cartpole", "--peer", "sb3"], "dqn.double_q=True has no SB3 DQN counterpart"),
])
def test_peer_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code = main(["run", *argv, "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_missing_library_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.specs.peers as peers

    real_import = peers.importlib.import_module

    def without_sb3(name: str):  # noqa: ANN202
        if name == "stable_baselines3":
            raise ImportError(name)
        return real_import(name)

    monkeypatch.setattr(peers.importlib, "import_module", without_sb3)
    with pytest.raises(UserError, match=r"needs stable-baselines3; install it with pip install 'rlgauge\[peers\]'"):
        load_peer("sb3")


def test_the_peer_writes_no_log_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """SB3's default logger makes a folder in the temp directory for every model it trains."""
    import tempfile

    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    trainer = make_trainer(peer_settings(resolution("ppo-cartpole-sb3", ["device=cpu", "ppo.num_steps=16"]).config),
                           device="cpu", seed=1)
    try:
        trainer.iterate()
    finally:
        trainer.close()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("SB3")] == []
