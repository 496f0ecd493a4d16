"""The loop DQN and IQN share (reference_trainers/value/loop.py), for both algorithms:
each acting/replay flag takes its own path and keeps its parity class, the update schedule and
target network, stability, float32 only, config errors, the standalone entry points, and the
slow learning check of the shipped presets."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from matmul_dtypes import MatmulDtypes
from value_trainers import ALGOS, assert_params_close, assert_params_equal, make, snapshot, tiny, train

import reference_trainers.value.dqn as dqn_mod
import reference_trainers.value.iqn as iqn_mod
from flag_effects import tensor_calls
from reference_trainers import ResumableTrainer, build_trainer
from reference_trainers.replay.buffers import ListStorage, TensorStorage, UniformSampler
from reference_trainers.config.schema import ConfigError, build_config, to_plain_dict
from reference_trainers.paths.learner import NonFiniteError
from reference_trainers.replay.writers import NStepWriter, OneStepWriter
from reference_trainers.replay.per import PrioritizedSampler
from reference_trainers.config.resolve import resolve_config
from reference_trainers.value.dqn import DQNTrainer
from reference_trainers.value.iqn import IQNTrainer

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
algos = pytest.mark.parametrize("algo", ALGOS)


class WideDtypeOps(TorchDispatchMode):
    """Records every dispatched op that touches a float64 tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.dtype == torch.float64 for t in tree_flatten((args, kwargs, out))[0]):
            self.ops.append(str(func))
        return out


# --------------------------------------------------------------------------- registry and config

@algos
def test_build_trainer_picks_the_trainer_for_the_algo(algo: str) -> None:
    trainer = make(algo)
    try:
        assert type(trainer) is {"dqn": DQNTrainer, "iqn": IQNTrainer}[algo]
        assert isinstance(trainer, ResumableTrainer)
        assert trainer.hp is getattr(trainer.config, algo)
    finally:
        trainer.close()


@pytest.mark.parametrize(("override", "fragment"), [
    ("dqn.buffer_size=8", "dqn.buffer_size: 8 is smaller than dqn.batch_size=32; accepted: an integer >= 32"),
    ("dqn.n_step=0", "dqn.n_step: invalid value 0: input should be greater than or equal to 1"),
    ("dqn.per_alpha=1.5", "dqn.per_alpha: invalid value 1.5: input should be less than or equal to 1"),
    ("dqn.per_beta=-0.1", "dqn.per_beta: invalid value -0.1: input should be greater than or equal to 0"),
    ("dqn.per_eps=0", "dqn.per_eps: invalid value 0: input should be greater than 0"),
    ("optimizations.replay=deque", "optimizations.replay: invalid value 'deque': expected 'list', 'tensor' or 'auto'"),
    ("env.id=Pendulum-v1", "env.id: dqn needs a Discrete action space, 'Pendulum-v1' has Box"),
    ("dqn.tau=0", "dqn.tau: invalid value 0: input should be greater than 0"),
])
def test_bad_replay_settings_are_one_line_config_errors(override: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_config(build_config({"algo": "dqn"}, ["device=cpu", "dqn.batch_size=32", override]))
    message = str(info.value)
    assert "\n" not in message and fragment in message, message


def test_iqn_settings_are_validated_in_their_own_section() -> None:
    with pytest.raises(ConfigError, match=r"^iqn.kappa: invalid value 0: input should be greater than 0"):
        build_config({"algo": "iqn"}, ["iqn.kappa=0"])
    with pytest.raises(ConfigError, match="iqn.buffer_size: 16 is smaller than iqn.batch_size=32"):
        resolve_config(build_config({"algo": "iqn"}, ["device=cpu", "iqn.batch_size=32", "iqn.buffer_size=16"]))


def test_tensor_replay_for_ppo_is_rejected_and_auto_resolves_per_algo() -> None:
    with pytest.raises(ConfigError, match="optimizations.replay: 'tensor' has no effect for algo 'ppo'"):
        resolve_config(build_config({}, ["device=cpu", "optimizations.replay=tensor"]))
    ppo = resolve_config(build_config({}, ["device=cpu", "optimizations.replay=auto"]))
    dqn = resolve_config(build_config({"algo": "dqn"}, ["device=cpu", "optimizations.replay=auto"]))
    assert (ppo.config.optimizations.replay, dqn.config.optimizations.replay) == ("list", "tensor")
    assert "optimizations.replay" in ppo.reasons and "optimizations.replay" in dqn.reasons


def test_other_algorithms_sections_are_ignored_and_not_recorded() -> None:
    """Chosen behaviour: a section for another algorithm is validated, unused and left out of the record."""
    plain, _, _ = train("dqn")
    with_ppo, _, _ = train("dqn", "ppo.num_steps=3", "iqn.kappa=5", "ppo.num_minibatches=7")
    assert_params_equal(with_ppo, plain)
    recorded = to_plain_dict(build_config({"algo": "dqn"}, ["ppo.num_steps=3"]))
    assert "dqn" in recorded and "ppo" not in recorded and "iqn" not in recorded
    assert set(to_plain_dict(build_config({}, ["dqn.batch_size=4"]))) >= {"ppo"} - {"dqn", "iqn"}
    assert "dqn" not in to_plain_dict(build_config({}, ["dqn.batch_size=4"]))
    with pytest.raises(ConfigError, match="^dqn.gama: unknown key"):  # still validated
        build_config({}, ["dqn.gama=0.9"])


@algos
def test_optimisation_summary_names_the_replay_storage(algo: str) -> None:
    from reference_trainers.config.resolve import optimisation_summary

    line = optimisation_summary(resolve_config(build_config({"algo": algo}, ["device=cpu"])).config)
    assert "replay=list" in line.split()
    assert "replay=" not in optimisation_summary(resolve_config(build_config({}, ["device=cpu"])).config)


# --------------------------------------------------------------------------- acting: batch_inference

@algos
@pytest.mark.parametrize(("overrides", "forward_rows", "cpu_calls_per_step"), [
    pytest.param([], [1, 1, 1, 1], 4, id="per-env"),
    pytest.param(["optimizations.batch_inference=true"], [4], 1, id="batched"),
    pytest.param(["optimizations.batch_inference=true", "optimizations.inference_batch_size=3"], [3, 1], 1,
                 id="chunked"),
])
def test_batch_inference_controls_forwards_and_host_copies_per_step(algo: str, overrides: list[str],
                                                                    forward_rows: list[int],
                                                                    cpu_calls_per_step: int) -> None:
    trainer = make(algo, "env.num_envs=4", f"{algo}.learning_starts=100000", *overrides)
    rows: list[int] = []
    forward = trainer.forward
    trainer.forward = lambda obs, *taus: (rows.append(obs.shape[0]), forward(obs, *taus))[1]
    try:
        with tensor_calls("cpu") as calls:
            for _ in range(3):
                trainer._env_step()
    finally:
        trainer.close()
    assert rows == forward_rows * 3
    assert calls["cpu"] == cpu_calls_per_step * 3


@algos
@pytest.mark.parametrize("chunk", [None, 1, 3])
def test_batched_epsilon_greedy_picks_the_same_actions_as_per_env(algo: str, chunk: int | None) -> None:
    extra = ["optimizations.batch_inference=true"] + ([f"optimizations.inference_batch_size={chunk}"] if chunk else [])
    plain, fast = make(algo, "env.num_envs=5"), make(algo, "env.num_envs=5", *extra)
    try:
        for trainer in (plain, fast):
            trainer.agent_steps = 30  # epsilon halfway: both random and greedy actions occur
        obs = plain.next_obs
        picked = [(plain.select_actions(obs), fast.select_actions(obs)) for _ in range(40)]
    finally:
        plain.close()
        fast.close()
    for a, b in picked:
        assert a.dtype == b.dtype == np.int64 and a.shape == (5,)
        np.testing.assert_array_equal(a, b)
    assert len({tuple(a) for a, _ in picked}) > 1


@algos
def test_epsilon_decays_linearly_and_controls_exploration(algo: str) -> None:
    trainer = make(algo, "env.num_envs=8", f"{algo}.start_epsilon=1.0", f"{algo}.end_epsilon=0.0",
                   f"{algo}.exploration_steps=100", "optimizations.batch_inference=true")
    trainer.policy.greedy = lambda obs, fractions: torch.ones(obs.shape[0], dtype=torch.int64)  # every greedy action is 1
    try:
        obs = trainer.next_obs
        trainer.agent_steps = 100
        assert trainer.epsilon() == 0.0
        assert all((trainer.select_actions(obs) == 1).all() for _ in range(10))
        trainer.agent_steps = 25
        assert trainer.epsilon() == pytest.approx(0.75)
        trainer.agent_steps = 0
        draws = np.concatenate([trainer.select_actions(obs) for _ in range(200)])
        assert set(draws) == set(range(trainer.num_actions))  # epsilon 1: uniform random actions
    finally:
        trainer.close()


# --------------------------------------------------------------------------- exact parity class

@algos
@pytest.mark.parametrize("overrides", [
    pytest.param(["optimizations.batch_inference=true"], id="batch_inference"),
    pytest.param(["optimizations.batch_inference=true", "optimizations.inference_batch_size=1"], id="chunked"),
    pytest.param(["optimizations.replay=tensor"], id="tensor_replay"),
    pytest.param(["optimizations.sync_free_logging=true"], id="sync_free_logging"),
    pytest.param(["env.vectorization=sync"], id="sync-vectorization"),
    pytest.param(["optimizations.replay=tensor", "{algo}.prioritized_replay=true", "{algo}.n_step=3"],
                 id="tensor_replay_with_per_and_nstep"),
])
def test_exact_class_flags_keep_parameters_from_same_seed(algo: str, overrides: list[str]) -> None:
    overrides = [o.format(algo=algo) for o in overrides]
    algorithmic = [o for o in overrides if o.startswith(algo)]
    plain, plain_stats, _ = train(algo, *algorithmic)
    fast, fast_stats, _ = train(algo, *overrides)
    assert_params_close(fast, plain, rtol=1e-6, atol=1e-7)
    assert plain_stats.keys() == fast_stats.keys()
    for k in plain_stats:
        assert math.isclose(fast_stats[k], plain_stats[k], rel_tol=1e-5, abs_tol=1e-7), k


@algos
@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_impl_params_match_forloop_within_fp_reorder(algo: str, impl: str) -> None:
    plain, _, _ = train(algo)
    fast, _, trainer = train(algo, f"optimizations.optimizer_impl={impl}")
    assert_params_close(fast, plain, rtol=1e-5, atol=1e-6)
    assert trainer.learner.optimizer.defaults["foreach" if impl == "foreach" else "fused"]


# --------------------------------------------------------------------------- replay paths

@algos
@pytest.mark.parametrize(("kind", "storage", "tolist_per_update"), [("list", ListStorage, 1), ("tensor", TensorStorage, 0)])
def test_replay_flag_picks_the_storage_and_its_copy_path(algo: str, kind: str, storage: type,
                                                         tolist_per_update: int) -> None:
    trainer = make(algo, f"optimizations.replay={kind}")
    try:
        assert type(trainer.replay.storage) is storage and type(trainer.replay.sampler) is UniformSampler
        for _ in range(12):
            trainer._env_step()
        with tensor_calls("tolist") as calls:
            trainer._update_phase(1)
        assert calls["tolist"] == tolist_per_update  # the list gathers sampled rows on the host
    finally:
        trainer.close()


@algos
def test_prioritized_replay_weights_the_loss_and_updates_priorities(algo: str) -> None:
    trainer = make(algo, f"{algo}.prioritized_replay=true", "optimizations.replay=tensor")
    try:
        sampler = trainer.replay.sampler
        assert isinstance(sampler, PrioritizedSampler)
        for _ in range(12):
            trainer._env_step()
        before = sampler.sums.clone()
        batch_sizes: list[int] = []
        step = trainer.learner.step
        trainer.learner.step = lambda *batch: (batch_sizes.append(len(batch)), step(*batch))[1]
        trainer._update_phase(1)
        assert not torch.equal(before, sampler.sums)  # priorities now follow the TD errors
        assert batch_sizes == [{"dqn": 6, "iqn": 9}[algo]]  # the importance weights ride along
        assert trainer._beta() == pytest.approx(0.4 + 0.6 * trainer.agent_steps / trainer.hp.per_beta_steps)
    finally:
        trainer.close()


@algos
@pytest.mark.parametrize("n_step", [1, 3])
def test_n_step_picks_the_writer_and_its_bootstrap_discount(algo: str, n_step: int) -> None:
    trainer = make(algo, f"{algo}.n_step={n_step}", f"{algo}.gamma=0.5", "optimizations.replay=tensor",
                   f"{algo}.learning_starts=100000")
    try:
        assert type(trainer.writer) is (OneStepWriter if n_step == 1 else NStepWriter)
        for _ in range(30):
            trainer._env_step()
        bootstrap = set(trainer.replay.storage.rows[:len(trainer.replay), -2].tolist())
    finally:
        trainer.close()
    assert bootstrap <= {0.0, 0.125, 0.25, 0.5} and 0.5 ** n_step in bootstrap


@algos
def test_reset_steps_are_not_written_to_replay(algo: str) -> None:
    trainer = make(algo, f"{algo}.learning_starts=100000", "env.kwargs.max_episode_steps=5")
    try:
        for _ in range(40):
            trainer._env_step()
        # 2 envs x 40 steps; each finished episode costs one reset step that is never written
        resets = trainer.tracker.completed - int(trainer.episode_over.sum())
        assert len(trainer.replay) == 80 - resets and resets >= 12
    finally:
        trainer.close()


# --------------------------------------------------------------------------- update schedule and target

@algos
@pytest.mark.parametrize(("frequency", "gradient_steps"), [(1, 1), (3, 2)])
def test_updates_follow_learning_starts_train_frequency_and_gradient_steps(algo: str, frequency: int,
                                                                            gradient_steps: int) -> None:
    trainer = make(algo, f"{algo}.learning_starts=20", f"{algo}.train_frequency={frequency}",
                   f"{algo}.gradient_steps={gradient_steps}", f"{algo}.log_interval=60")
    try:
        result = trainer.iterate()
        transitions = len(trainer.replay)
    finally:
        trainer.close()
    # 30 vector steps of 2 envs; due at vector steps v with v % frequency == 0 and 2v >= 20
    expected = sum(gradient_steps for v in range(1, 31) if v % frequency == 0 and 2 * v >= 20)
    assert (result.agent_steps, result.updates) == (60, expected)
    assert result.env_steps == transitions  # less the reset steps, which take no transition


@algos
def test_target_network_is_a_hard_copy_every_interval(algo: str) -> None:
    trainer = make(algo, f"{algo}.target_update_interval=3", f"{algo}.learning_starts=8")
    try:
        for _ in range(4):
            trainer._env_step()
        for update in range(1, 7):
            before = snapshot(trainer.target)
            trainer._update_phase(1)
            target, online = snapshot(trainer.target), snapshot(trainer.model)
            if update % 3:
                assert_params_equal(target, before)
            else:
                assert_params_equal(target, online)
    finally:
        trainer.close()


@algos
def test_polyak_tau_moves_the_target_a_fraction_of_the_way(algo: str) -> None:
    trainer = make(algo, f"{algo}.tau=0.25", f"{algo}.target_update_interval=1")
    try:
        with torch.no_grad():
            for p in trainer.model.parameters():
                p.add_(1.0)
        target, online = snapshot(trainer.target), snapshot(trainer.model)
        trainer.update_target()
        after = snapshot(trainer.target)
    finally:
        trainer.close()
    for k in after:
        torch.testing.assert_close(after[k], target[k] + 0.25 * (online[k] - target[k]))


# --------------------------------------------------------------------------- stability

@pytest.fixture
def nan_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every DQN and IQN loss NaN (through the pure loss functions the trainers call)."""
    real_td, real_qh = dqn_mod.td_loss, iqn_mod.quantile_huber_loss
    monkeypatch.setattr(dqn_mod, "td_loss", lambda *a: (real_td(*a)[0] * float("nan"), real_td(*a)[1]))
    monkeypatch.setattr(iqn_mod, "quantile_huber_loss", lambda *a: real_qh(*a) * float("nan"))


@algos
def test_nan_policy_raise_raises(algo: str, nan_loss: None) -> None:
    trainer = make(algo, "stability.nan_policy=raise")
    try:
        with pytest.raises(NonFiniteError, match="nan_policy=raise"):
            trainer.iterate()
        assert trainer.nonfinite_events == 9  # updates at vector steps 8..16
    finally:
        trainer.close()


@algos
def test_nan_policy_skip_update_keeps_parameters(algo: str, nan_loss: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    trainer = make(algo, "stability.nan_policy=skip_update", f"{algo}.prioritized_replay=true")
    try:
        before = snapshot(trainer.model)
        result = trainer.iterate()
        assert_params_equal(snapshot(trainer.model), before)
        assert trainer.nonfinite_events == result.updates == 9
        assert torch.isfinite(trainer.replay.sampler.sums).all()
    finally:
        trainer.close()


@algos
def test_nan_policy_warn_counts_and_warns(algo: str, nan_loss: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="rlgauge")
    trainer = make(algo, "stability.nan_policy=warn")
    try:
        result = trainer.iterate()
    finally:
        trainer.close()
    assert trainer.nonfinite_events == result.updates == 9
    assert sum("nan_policy=warn" in r.getMessage() for r in caplog.records) == 1


@algos
@pytest.mark.parametrize("variant", [
    [], ["optimizations.batch_inference=true", "optimizations.replay=tensor", "optimizations.sync_free_logging=true",
         "optimizations.optimizer_impl=fused"],
    ["optimizations.replay=tensor", "{algo}.prioritized_replay=true", "{algo}.n_step=3", "{algo}.double_q=true",
     "{algo}.tau=0.5"],
    ["{algo}.prioritized_replay=true", "{algo}.n_step=2"],
], ids=["plain", "optimised", "tensor-per-nstep", "list-per-nstep"])
def test_training_path_is_float32_only(algo: str, variant: list[str]) -> None:
    trainer = make(algo, "env.id=Acrobot-v1", *(v.format(algo=algo) for v in variant))
    try:
        wide = WideDtypeOps()
        with wide:
            result = trainer.iterate()
            trainer.select_actions(trainer.next_obs)
        assert result.updates > 0
        assert wide.ops == [], f"float64 ops on the training path: {Counter(wide.ops)}"
        tensors = [*trainer.model.parameters(), *trainer.target.parameters()]
        tensors += [v for s in trainer.learner.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        tensors += [t for t in vars(trainer.replay.storage).values() if torch.is_tensor(t)]
        tensors += [t for t in vars(trainer.replay.sampler).values() if torch.is_tensor(t)]
        assert all(t.dtype in (torch.float32, torch.int64) for t in tensors)
        assert trainer.last_stats and all(type(v) is float and math.isfinite(v) for v in trainer.last_stats.values())
    finally:
        trainer.close()


@algos
def test_amp_bfloat16_runs_acting_and_update_forwards_in_bf16(algo: str) -> None:
    trainer = make(algo, "optimizations.amp=true", "optimizations.amp_dtype=bfloat16")
    try:
        with MatmulDtypes() as seen:
            trainer.iterate()
        assert trainer.updates > 0
        # hidden layers in bf16 while acting and in the update; the output layers stay float32
        assert torch.bfloat16 in seen.dtypes_where(grad_enabled=True)
        assert torch.bfloat16 in seen.dtypes_where(grad_enabled=False)
        assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in trainer.model.parameters())
    finally:
        trainer.close()


@algos
def test_compile_failure_falls_back_to_eager_and_is_recorded(algo: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, _, _ = train(algo)

    def broken(fn: Any, **kwargs: Any) -> Any:
        raise RuntimeError("planted compile failure")

    monkeypatch.setattr(torch, "compile", broken)
    fast, _, trainer = train(algo, "optimizations.compile_model=true", "optimizations.compile_train_step=true")
    assert trainer.compile_fallback is True
    assert_params_equal(fast, plain)


@algos
def test_sync_free_logging_leaves_one_host_sync_per_vector_step(algo: str) -> None:
    from harness.diagnosis.frames import SiteFinder
    from harness.diagnosis.host_syncs import HostSyncFinder

    fast = ["optimizations.batch_inference=true", "optimizations.replay=tensor", "optimizations.sync_free_logging=true",
            "optimizations.optimizer_impl=fused"]
    counts = {}
    for name, overrides in (("plain", []), ("fast", fast)):
        trainer = make(algo, *overrides)
        try:
            trainer.iterate()
            syncs = HostSyncFinder(trainer.device, SiteFinder())
            with syncs:
                result = trainer.iterate()
            counts[name] = syncs.count / (result.agent_steps // trainer.num_envs)
        finally:
            trainer.close()
    assert counts["fast"] <= 1.0 + 1 / 16  # the action copy per step, one stats flush per iteration
    assert counts["plain"] >= 2 * 2  # per-env action copies, list gathers, .item() per logged value


# --------------------------------------------------------------------------- harness protocol, standalone

@algos
def test_trainer_offers_what_the_runner_uses(algo: str) -> None:
    trainer = make(algo)
    try:
        trainer.activate()
        result = trainer.iterate()
        assert result.agent_steps == 32 and result.env_steps == trainer.env_steps == len(trainer.replay)
        actions = trainer.select_actions(np.array(trainer.next_obs, copy=True))
        assert actions.shape == (2,) and all(trainer.envs.single_action_space.contains(a) for a in actions)
        assert trainer.mean_recent_return() is None or trainer.mean_recent_return() > 0
        assert trainer.compile_fallback is False and trainer.nonfinite_events == 0
        assert "loss" in trainer.last_stats and "epsilon" in trainer.last_stats
    finally:
        trainer.close()


@algos
def test_value_trainer_module_trains_from_a_yaml_config(algo: str, tmp_path: Path) -> None:
    config = tmp_path / "cartpole.yaml"
    config.write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}, "device": "cpu"}))
    args = [sys.executable, "-m", f"reference_trainers.value.{algo}", "--config", str(config), "--steps", "64"]
    for override in tiny(algo)[1:]:
        args += ["--set", override]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("env_steps=")]
    assert lines and int(lines[-1].split()[0].split("=")[1]) >= 64 and "loss=" in lines[-1]
    config.write_text(yaml.safe_dump({"algo": "ppo"}))
    wrong = subprocess.run(args[:5], capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "algo: 'ppo'" in wrong.stderr


# --------------------------------------------------------------------------- CUDA

@needs_cuda
@algos
def test_cuda_graphs_and_pinned_copies_match_eager_on_cuda(algo: str) -> None:
    base = ["device=cuda", "optimizations.batch_inference=true", "optimizations.replay=tensor"]
    eager, _, _ = train(algo, *base)
    pinned, _, _ = train(algo, *base, "optimizations.pinned_memory=true", "optimizations.non_blocking=true")
    graphed, stats, trainer = train(algo, *base, "optimizations.cuda_graphs=true")
    assert trainer.learner.graphed is not None and trainer.learner.graphed.eager_calls == 0
    assert_params_close(pinned, eager, rtol=1e-6, atol=1e-6)
    assert_params_close(graphed, eager, rtol=1e-5, atol=1e-5)
    assert all(math.isfinite(v) for v in stats.values())


# --------------------------------------------------------------------------- learning (slow)

@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
@algos
def test_value_based_cartpole_learns_both_variants(algo: str, variant: str, seed: int) -> None:
    from harness.specs.presets import load_preset

    data = load_preset(f"{algo}-cartpole").variant_data(variant)
    # one intra-op thread (an fp-reorder setting, not an algorithmic one) keeps the run time independent of
    # other load: two OpenMP threads on two busy cores can slow the baseline's update down many times
    overrides = ["device=cpu", f"seed={seed}", "optimizations.torch_threads=1"]
    trainer = build_trainer(resolve_config(build_config(data, overrides)))
    best = -math.inf
    original_threads = torch.get_num_threads()
    try:
        while trainer.env_steps < 160_000 and best < 195.0:
            trainer.iterate()
            mean = trainer.mean_recent_return()
            if trainer.tracker.completed >= 20 and mean is not None:
                best = max(best, mean)
    finally:
        trainer.close()
        torch.set_num_threads(original_threads)
    assert best >= 195.0, f"{algo} {variant} seed {seed}: best mean return of the last 20 episodes {best} after {trainer.env_steps} env steps"


def test_one_step_tensor_replay_inserts_directly_and_trains_as_the_general_insert() -> None:
    """Under ``replay_direct_write`` (one-step writer, CPU tensor replay) steps with no reset row
    skip the writer's batch (``ReplayBuffer.add_one_step``); the run ends with the parameters and
    replay of the general insert, bit for bit."""
    flags = ("optimizations.replay=tensor", "env.vectorization=sync")
    direct = make("dqn", *flags, "optimizations.replay_direct_write=true")
    general = make("dqn", *flags, "optimizations.replay_direct_write=false")
    pushes = []
    push = direct.writer.push
    direct.writer.push = lambda *args: pushes.append(1) or push(*args)  # type: ignore[method-assign]
    try:
        for _ in range(2):
            direct.iterate()
            general.iterate()
        assert direct.updates == general.updates > 0
        assert 0 < len(pushes) < direct.vector_steps  # reset steps and ring wraps still go through the writer
        for name, value in snapshot(direct.model).items():
            assert torch.equal(value, snapshot(general.model)[name]), name
        assert torch.equal(direct.replay.storage.rows, general.replay.storage.rows)
    finally:
        direct.close()
        general.close()


@pytest.mark.parametrize("algo", ALGOS)
def test_env_steps_count_transitions_not_reset_steps(algo: str) -> None:
    """A NEXT_STEP reset step takes no transition and writes none to replay: env steps are replay's rows."""
    trainer = make(algo, f"{algo}.buffer_size=100000", f"{algo}.log_interval=256")
    try:
        result = trainer.iterate()
        assert trainer.tracker.completed > 0, "episodes should have ended"
        assert result.env_steps == trainer.env_steps == len(trainer.replay) < result.agent_steps
    finally:
        trainer.close()
