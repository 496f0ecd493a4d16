"""The PPO rollout and update flags that once rode inside ``lean_rollout`` (``stacked_mlps``,
``fused_gae``, ``packed_gather``), ``lean_rollout`` itself, and IQN's ``hand_written_quantile_loss``:
each alone switches its path (an observable effect, on and off), none takes another's, and each
keeps its parity class against its plain path from the same seed, alone and in every combination
with the others and with the acting and update paths it meets (``numpy_acting``,
``batch_inference``, ``analytic_grads``)."""

from __future__ import annotations

import functools
import itertools
from collections import Counter

import pytest
import torch
from flag_effects import running, spy
from properties.parity_runs import Outcome, assert_clean, assert_parity, train

import reference_trainers.value.iqn as iqn_mod
import reference_trainers.ppo.minibatches as minibatches
import reference_trainers.ppo.trainer as ppo_mod
from harness.stats.parity import TOLERANCES
from reference_trainers.config.flags import EXACT, FP_REORDER, flag
from reference_trainers.nets.networks import StackedMLPs
from reference_trainers.nets.mlp import NumpyMLP
from reference_trainers.paths.speedups import HostToDevice

STEPS, ENVS = 8, 3
"""The rollout of ``flag_effects.TINY['ppo']``: steps per sub-env, sub-envs."""
SEED = 3
UNBUNDLED = ("lean_rollout", "stacked_mlps", "fused_gae", "packed_gather")


def on(name: str, value: bool = True) -> str:
    return f"optimizations.{name}={str(value).lower()}"


def path_spies(monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Calls of each unbundled flag's optimised path and of the plain paths beside them."""
    return {"rollout_scalars": spy(monkeypatch, HostToDevice, "__call__", lambda _self, _array, name, *_: name),
            "stacked": spy(monkeypatch, StackedMLPs, "__init__"),
            "side_by_side": spy(monkeypatch, NumpyMLP, "side_by_side"),
            "gae": spy(monkeypatch, ppo_mod, "compute_gae"),
            "gae_fused": spy(monkeypatch, ppo_mod, "compute_gae_fused"),
            "packed": spy(monkeypatch, minibatches, "packed_gather")}


# --------------------------------------------------------------------------- effects

@pytest.mark.flag_effect("optimizations.lean_rollout")
@pytest.mark.parametrize("algo", ["ppo", "ppo-lstm"])
@pytest.mark.parametrize("lean", [False, True])
def test_lean_rollout_copies_the_rollout_scalars_once_and_nothing_else(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                                      lean: bool) -> None:
    """On: the reset mask and step results cross once per rollout. Off: once per step. Either way
    no stacked network, fused GAE or packed gather: those are flags of their own."""
    spies = path_spies(monkeypatch)
    with running(algo, "optimizations.batch_inference=true", on("lean_rollout", lean)) as trainer:
        spies["rollout_scalars"].clear()
        trainer.iterate()
    copies = Counter(spies["rollout_scalars"])
    if lean:
        assert copies["rollout_scalars"] == 1 and copies["valid"] == copies["flags"] == 0
    else:
        assert copies["valid"] == copies["flags"] == STEPS and copies["rollout_scalars"] == 0
    assert len(spies["gae"]) == 1
    assert not (spies["stacked"] or spies["side_by_side"] or spies["gae_fused"] or spies["packed"])


@pytest.mark.parametrize("lean", [False, True])
def test_lean_rollout_stages_numpy_acting_observations_on_the_host_only_when_on(lean: bool) -> None:
    with running("ppo", "optimizations.numpy_acting=true", on("lean_rollout", lean)) as trainer:
        trainer.collect()
        assert (trainer.host_obs is not None) is lean
        if lean:
            torch.testing.assert_close(trainer.obs_buf, torch.from_numpy(trainer.host_obs), rtol=0, atol=0)


@pytest.mark.flag_effect("optimizations.stacked_mlps")
@pytest.mark.parametrize("stacked", [False, True])
def test_stacked_mlps_acts_through_one_stacked_torch_network(monkeypatch: pytest.MonkeyPatch, stacked: bool) -> None:
    """On: one ``StackedMLPs`` snapshot per rollout serves every acting forward and the bootstrap
    value; the model's own forward runs only for the update. Off: the model's forward acts."""
    calls = spy(monkeypatch, StackedMLPs, "__call__", lambda _self, x: x.shape[0])
    built = spy(monkeypatch, StackedMLPs, "__init__")
    with running("ppo", "optimizations.batch_inference=true", on("stacked_mlps", stacked)) as trainer:
        acting: list[int] = []
        handle = trainer.model.register_forward_pre_hook(
            lambda _m, inputs: None if torch.is_grad_enabled() else acting.append(inputs[0].shape[0]))
        trainer.iterate()
        handle.remove()
        assert trainer.policy.stacked is None  # dropped once the update changed the weights
    if stacked:
        assert len(built) == 1 and calls == [ENVS] * (STEPS + 1) and acting == []
    else:
        assert not built and not calls and acting == [ENVS] * (STEPS + 1)


@pytest.mark.flag_effect("optimizations.stacked_mlps")
@pytest.mark.parametrize("stacked", [False, True])
def test_stacked_mlps_decides_the_numpy_acting_forward(monkeypatch: pytest.MonkeyPatch, stacked: bool) -> None:
    """With ``numpy_acting``: on, one side-by-side NumPy forward per acting step; off, the actor's
    and the critic's NumPy forwards, one each."""
    side_by_side = spy(monkeypatch, NumpyMLP, "side_by_side")
    forwards = spy(monkeypatch, NumpyMLP, "__call__")
    with running("ppo", "optimizations.batch_inference=true", "optimizations.numpy_acting=true",
                 on("stacked_mlps", stacked)) as trainer:
        trainer.collect()
    assert len(side_by_side) == (1 if stacked else 0)
    assert len(forwards) == STEPS * (1 if stacked else 2)


@pytest.mark.flag_effect("optimizations.fused_gae")
@pytest.mark.parametrize("algo", ["ppo", "ppo-lstm"])
@pytest.mark.parametrize("fused", [False, True])
def test_fused_gae_computes_the_advantages_with_the_fused_loop(monkeypatch: pytest.MonkeyPatch, algo: str,
                                                              fused: bool) -> None:
    spies = path_spies(monkeypatch)
    with running(algo, on("fused_gae", fused)) as trainer:
        trainer.iterate()
    assert (len(spies["gae_fused"]), len(spies["gae"])) == ((1, 0) if fused else (0, 1))
    assert not (spies["stacked"] or spies["packed"]) and Counter(spies["rollout_scalars"])["rollout_scalars"] == 0


@pytest.mark.flag_effect("optimizations.packed_gather")
@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("packed", [False, True])
def test_packed_gather_gathers_each_minibatch_from_one_packed_tensor(monkeypatch: pytest.MonkeyPatch, env: str,
                                                                    packed: bool) -> None:
    """On: the batch is packed once per update phase and each minibatch is one ``index_select``
    of it. Off: one indexing per field and minibatch, and nothing packed."""
    spies = path_spies(monkeypatch)
    selects = spy(monkeypatch, torch.Tensor, "index_select")
    with running("ppo", f"env.id={env}", on("packed_gather", packed)) as trainer:
        updates = trainer.iterate().updates
    assert updates == 2
    assert (len(spies["packed"]), len(selects)) == ((1, updates) if packed else (0, 0))
    assert not (spies["stacked"] or spies["gae_fused"])


@pytest.mark.flag_effect("optimizations.hand_written_quantile_loss")
@pytest.mark.parametrize("hand_written", [False, True])
def test_hand_written_quantile_loss_runs_the_custom_autograd_function(monkeypatch: pytest.MonkeyPatch,
                                                                      hand_written: bool) -> None:
    """On: every IQN loss goes through ``_QuantileHuber`` (its own backward). Off: never; autograd
    differentiates the loss's tensor ops."""
    custom = spy(monkeypatch, iqn_mod._QuantileHuber, "apply")
    losses = spy(monkeypatch, iqn_mod, "quantile_huber_loss")
    backwards = spy(monkeypatch, iqn_mod._QuantileHuber, "backward")
    with running("iqn", on("hand_written_quantile_loss", hand_written)) as trainer:
        updates = trainer.iterate().updates
    assert updates > 0 and len(losses) == updates
    assert (len(custom), len(backwards)) == ((updates, updates) if hand_written else (0, 0))


# --------------------------------------------------------------------------- parity

def tolerance(name: str) -> str:
    """The flag's parity class, which the tests below hold it to."""
    return flag(f"optimizations.{name}").parity


def test_the_unbundled_flags_declare_the_classes_their_paths_keep() -> None:
    assert [tolerance(n) for n in UNBUNDLED] == [EXACT, FP_REORDER, FP_REORDER, EXACT]
    assert tolerance("hand_written_quantile_loss") == FP_REORDER and FP_REORDER in TOLERANCES


def parity_run(algo: str, *overrides: str) -> Outcome:
    """A tiny run from ``SEED`` under the float64 sentinel (one torch thread: tiny updates), checked clean."""
    outcome = train(["optimizations.torch_threads=1", *overrides], seed=SEED, algo=algo)
    assert_clean(outcome)
    return outcome


@functools.lru_cache(maxsize=16)
def plain_run(algo: str, *overrides: str) -> Outcome:
    """The run with every flag under test off (cached: many tests compare against it)."""
    return parity_run(algo, *overrides)


@pytest.mark.parametrize(("name", "algo", "extra"), [
    ("lean_rollout", "ppo", []), ("lean_rollout", "ppo-lstm", []),
    ("lean_rollout", "ppo", ["optimizations.numpy_acting=true"]), ("lean_rollout", "ppo", ["env.id=Pendulum-v1"]),
    ("stacked_mlps", "ppo", []), ("stacked_mlps", "ppo", ["optimizations.batch_inference=true"]),
    ("stacked_mlps", "ppo", ["optimizations.numpy_acting=true"]), ("stacked_mlps", "ppo", ["env.id=Pendulum-v1"]),
    ("fused_gae", "ppo", []), ("fused_gae", "ppo-lstm", []),
    ("packed_gather", "ppo", []), ("packed_gather", "ppo", ["env.id=Pendulum-v1"]),
    ("hand_written_quantile_loss", "iqn", []),
])
def test_each_flag_keeps_its_parity_class_against_its_plain_path(name: str, algo: str, extra: list[str]) -> None:
    """From the same seed, the flag on against the same configuration with it off."""
    assert_parity(parity_run(algo, *extra, on(name)), plain_run(algo, *extra), tolerance(name))


COMBINATIONS = list(itertools.product([False, True], repeat=len(UNBUNDLED)))
PATHS = {"torch": [], "numpy": ["optimizations.numpy_acting=true", "optimizations.batch_inference=true"],
         "analytic": ["optimizations.analytic_grads=true", "optimizations.batch_inference=true"]}


@pytest.mark.parametrize("paths", list(PATHS))
@pytest.mark.parametrize("values", COMBINATIONS, ids=lambda v: "".join("10"[not x] for x in v))
def test_every_combination_keeps_fp_reorder_parity(values: tuple[bool, ...], paths: str) -> None:
    """Every on/off combination of the four rollout/update flags, on each acting/update path, runs
    clean and stays within the loosest class among them of the same path with all four off."""
    flags = [on(name, value) for name, value in zip(UNBUNDLED, values)]
    loosest = FP_REORDER if any(value and tolerance(name) == FP_REORDER for name, value in zip(UNBUNDLED, values)) \
        else EXACT
    assert_parity(parity_run("ppo", *PATHS[paths], *flags), plain_run("ppo", *PATHS[paths]), loosest)


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("kappa", [0.5, 1.0, 3.0])
def test_hand_written_quantile_loss_gives_the_autograd_loss_and_gradient(kappa: float, ties: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    quantiles = torch.randn(6, 8, generator=gen) * 2
    targets = torch.randn(6, 5, generator=gen) * 2
    if ties:  # delta == 0 exactly, where the indicator and the Huber kink meet
        targets[:, 0] = quantiles[:, 0]
        targets[:, 1] = quantiles[:, 1] + kappa
    taus, upstream = torch.rand(6, 8, generator=gen), torch.rand(6, generator=gen)
    results = []
    for hand_written in (False, True):
        q = quantiles.clone().requires_grad_()
        loss = iqn_mod.quantile_huber_loss(q, targets, taus, kappa, hand_written)
        (loss * upstream).sum().backward()
        results.append((loss.detach(), q.grad))
    tol = TOLERANCES[FP_REORDER]
    for plain, by_hand in zip(*results):
        torch.testing.assert_close(by_hand, plain, rtol=tol.rtol, atol=tol.atol)
