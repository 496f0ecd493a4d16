"""Tests for ``optimizations.analytic_grads`` (hand-written MLP, PPO-loss and DQN-loss gradients), the
stacked actor-critic of ``lean_rollout`` and the direct fused Adam step.

Each is compared with what it replaces (autograd, the separate MLPs, ``optimizer.step()``)
and checked to be the path actually taken.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import TINY
from flag_resolution import assert_auto_resolves, assert_refused
from ppo_loss_inputs import LOSS_INPUTS, loss_inputs
from value_trainers import assert_params_close
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.stats.parity import FP_REORDER as FP_REORDER_CLASS
from harness.stats.parity import TOLERANCES
from reference_trainers.nets import mlp as mlp_maths
from reference_trainers.config.schema import build_config
from reference_trainers.config.flags import TUNING
from reference_trainers.nets.networks import StackedMLPs, mlp
from reference_trainers.paths.speedups import FusedAdamStep
from reference_trainers.ppo.loss import PPOLossCoefs, ppo_loss, ppo_loss_grads
from reference_trainers.ppo.trainer import PPOTrainer, evaluate_actions

FP_REORDER = {"rtol": TOLERANCES[FP_REORDER_CLASS].rtol, "atol": TOLERANCES[FP_REORDER_CLASS].atol}


def autograd_reference(logits: torch.Tensor, values: torch.Tensor, batch: tuple[torch.Tensor, ...],
                       cfg: PPOLossCoefs) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    logits = logits.clone().requires_grad_(True)
    values = values.clone().requires_grad_(True)
    actions, old_logprob, advantages, returns, old_value, mask = batch
    new_logprob, entropy = evaluate_actions(logits, None, actions)
    loss, stats = ppo_loss(new_logprob, entropy, values, old_logprob, advantages, returns, old_value, mask, cfg)
    loss.backward()
    return loss.detach(), stats, logits.grad, values.grad


@settings(max_examples=60, deadline=None)
@given(**LOSS_INPUTS, norm_adv=st.booleans(), clip_vloss=st.booleans())
def test_ppo_loss_grads_match_autograd(rows: int, actions: int, seed: int, near_old: bool, masked: float, norm_adv: bool,
                                       clip_vloss: bool) -> None:
    logits, values, batch = loss_inputs(rows, actions, seed, near_old, masked)
    cfg = PPOLossCoefs(clip_coef=0.2, clip_vloss=clip_vloss, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv)
    loss, stats, grad_logits, grad_values = ppo_loss_grads(logits, values, *batch, cfg)
    ref_loss, ref_stats, ref_logits, ref_values = autograd_reference(logits, values, batch, cfg)
    torch.testing.assert_close(loss, ref_loss, **FP_REORDER)
    torch.testing.assert_close(grad_logits, ref_logits, **FP_REORDER)
    torch.testing.assert_close(grad_values, ref_values, **FP_REORDER)
    assert stats.keys() == ref_stats.keys()
    for name in stats:
        torch.testing.assert_close(stats[name], ref_stats[name], **FP_REORDER)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_backward_matches_autograd(activation: str) -> None:
    torch.manual_seed(0)
    net = mlp(5, [16, 12], 3, activation, out_std=1.0)
    x, grad_out = torch.randn(9, 5), torch.randn(9, 3)
    net(x).backward(grad_out)
    expected = {name: p.grad.clone() for name, p in net.named_parameters()}
    net.zero_grad(set_to_none=True)
    with torch.no_grad():
        out, saved = mlp_maths.mlp_forward(net, x)
        mlp_maths.mlp_backward(saved, grad_out)
    torch.testing.assert_close(out, net(x).detach(), rtol=0, atol=0)
    for name, p in net.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], **FP_REORDER)


def trainer(*overrides: str) -> PPOTrainer:
    return PPOTrainer(build_config({}, TINY + list(overrides)))


def trained(*overrides: str, iterations: int = 3) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    t = trainer(*overrides)
    try:
        for _ in range(iterations):
            t.iterate()
        return {k: p.detach().clone() for k, p in t.model.named_parameters()}, dict(t.last_stats)
    finally:
        t.close()


@pytest.mark.parametrize("extra", [[], ["ppo.norm_adv=false", "ppo.clip_vloss=false"], ["env.id=Acrobot-v1"],
                                   ["model.activation=relu"], ["stability.max_grad_norm=null"]])
def test_analytic_grads_train_like_autograd(extra: list[str]) -> None:
    plain, plain_stats = trained(*extra)
    fast, fast_stats = trained("optimizations.analytic_grads=true", *extra)
    assert_params_close(fast, plain, **FP_REORDER)
    for name in plain_stats:
        assert fast_stats[name] == pytest.approx(plain_stats[name], rel=1e-4, abs=1e-6), name


def test_analytic_grads_run_no_autograd_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    backwards: list[int] = []
    real = torch.Tensor.backward
    monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: backwards.append(1) or real(self, *a, **k))
    for flag, expect_backward in (("false", True), ("true", False)):
        backwards.clear()
        t = trainer(f"optimizations.analytic_grads={flag}")
        try:
            result = t.iterate()
            assert result.updates > 0
            assert bool(backwards) is expect_backward
            assert all(p.grad is not None for p in t.model.parameters())
        finally:
            t.close()


@pytest.mark.parametrize("max_grad_norm", ["1e-4", "null"])
def test_analytic_grads_write_into_one_flat_buffer_that_clipping_scales(max_grad_norm: str) -> None:
    """Every gradient is a view of ``Learner.flat_grad``; clipping scales that buffer to the norm."""
    t = trainer("optimizations.analytic_grads=true", f"stability.max_grad_norm={max_grad_norm}")
    try:
        flat = t.learner.flat_grad
        storage = flat.untyped_storage().data_ptr()
        t.iterate()
        grads = [p.grad for p in t.model.parameters()]
        assert all(g is not None and g.untyped_storage().data_ptr() == storage for g in grads)
        assert sum(g.numel() for g in grads) == flat.numel()
        norm = float(torch.linalg.vector_norm(flat))
        assert norm > 0
        if max_grad_norm != "null":
            assert norm == pytest.approx(1e-4, rel=1e-3)
    finally:
        t.close()
    plain = trainer("optimizations.analytic_grads=false")
    try:
        assert plain.learner.flat_grad is None
    finally:
        plain.close()


@pytest.mark.parametrize("max_grad_norm", [0.5, None])
def test_learner_clipped_is_the_in_place_clipping_as_a_pure_function(max_grad_norm: float | None) -> None:
    t = trainer("optimizations.analytic_grads=true")
    try:
        t.learner.max_grad_norm = max_grad_norm
        flat = torch.randn(t.learner.flat_grad.numel())
        clipped, norm, nonfinite = t.learner.clipped(flat, torch.tensor(1.0))
        assert nonfinite == 0.0 and t.learner.clipped(flat, torch.tensor(float("nan")))[2] == 1.0
        assert norm == torch.linalg.vector_norm(flat)
        expected = flat * min(1.0, 0.5 / (float(norm) + 1e-6)) if max_grad_norm else flat
        torch.testing.assert_close(clipped, expected)
    finally:
        t.close()


@pytest.mark.slow  # inductor compiles: seconds with a warm cache
@pytest.mark.parametrize("compiled", [False, True])
def test_the_compiled_hand_written_step_clips_inside_its_graph(compiled: bool) -> None:
    """Under compile_train_step the clipping is part of the compiled step: the loss closure hands
    the learner the norm (it neither recomputes it nor scales the buffer again), and the update
    still sees clipped gradients; eagerly the learner clips."""
    t = trainer("optimizations.analytic_grads=true", f"optimizations.compile_train_step={str(compiled).lower()}",
                "stability.max_grad_norm=1e-4")
    batches: list[tuple[torch.Tensor, ...]] = []
    step = t.learner.step
    t.learner.step = lambda *batch: batches.append(batch) or step(*batch)  # type: ignore[method-assign]
    try:
        t.iterate()
        assert not t.compile_fallback
        assert float(torch.linalg.vector_norm(t.learner.flat_grad)) == pytest.approx(1e-4, rel=1e-3)
        returned = t.learner.loss(*batches[0])
        assert len(returned) == (3 if compiled else 2)
        assert ("nonfinite" in returned[1]) is compiled  # else the learner checks finiteness itself
        if compiled:
            assert float(returned[2]) > 1e-4  # the norm before clipping
            assert float(torch.linalg.vector_norm(t.learner.flat_grad)) == pytest.approx(1e-4, rel=1e-3)
    finally:
        t.close()


@pytest.mark.slow  # inductor compiles: seconds with a warm cache
@pytest.mark.parametrize("policy", ["raise", "skip_update", "warn"])
def test_the_compiled_hand_written_step_reports_nonfinite_updates_to_every_nan_policy(policy: str) -> None:
    """The non-finite flag computed inside the compiled step drives ``stability.nan_policy`` as
    the learner's own check does: raise, skip (parameters kept), or count and go on."""
    from reference_trainers.paths.learner import NonFiniteError
    from value_trainers import snapshot

    t = trainer("optimizations.analytic_grads=true", "optimizations.compile_train_step=true",
                f"stability.nan_policy={policy}")
    try:
        with torch.no_grad():
            t.model.critic[-1].bias.fill_(float("nan"))  # values -> advantages -> loss are NaN
        before = snapshot(t.model)
        if policy == "raise":
            with pytest.raises(NonFiniteError, match="nan_policy=raise"):
                t.iterate()
        else:
            result = t.iterate()
            assert t.nonfinite_events == result.updates > 0
            if policy == "skip_update":
                after = snapshot(t.model)
                for name in before:
                    torch.testing.assert_close(after[name], before[name], rtol=0, atol=0, equal_nan=True)
        assert not t.compile_fallback
    finally:
        t.close()


@pytest.mark.parametrize("extra", [[], ["dqn.double_q=true"], ["dqn.prioritized_replay=true"], ["dqn.n_step=3"],
                                   ["model.activation=tanh"]])
def test_dqn_analytic_grads_train_like_autograd(monkeypatch: pytest.MonkeyPatch, extra: list[str]) -> None:
    from value_trainers import make
    results = []
    for flag in ("false", "true"):
        backwards: list[int] = []
        real = torch.Tensor.backward
        monkeypatch.setattr(torch.Tensor, "backward", lambda self, *a, **k: backwards.append(1) or real(self, *a, **k))
        t = make("dqn", f"optimizations.analytic_grads={flag}", *extra)
        try:
            for _ in range(4):
                t.iterate()
            assert t.updates > 0 and bool(backwards) is (flag == "false")
            results.append(({k: p.detach().clone() for k, p in t.model.named_parameters()}, dict(t.last_stats)))
        finally:
            t.close()
            monkeypatch.undo()
    (plain, plain_stats), (fast, fast_stats) = results
    assert_params_close(fast, plain, **FP_REORDER)
    for name in plain_stats:
        assert fast_stats[name] == pytest.approx(plain_stats[name], rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize(("overrides", "message"), [
    (["env.id=Pendulum-v1"], "continuous actions"),
    (["optimizations.amp=true", "optimizations.amp_dtype=bfloat16"], "amp"),
    (["optimizations.compile_model=true"], "compile_model compiles the module forward"),
    (["model.recurrent=lstm"], "model.recurrent 'lstm'"),
    (["algo=iqn"], "has no effect for algo 'iqn'"),
])
def test_analytic_grads_true_is_rejected_where_it_cannot_run(overrides: list[str], message: str) -> None:
    assert_refused("analytic_grads", overrides, message)


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], True), (["env.id=Pendulum-v1"], False), (["model.recurrent=gru"], False), (["algo=dqn"], True),
    (["algo=iqn"], False),
])
def test_analytic_grads_auto_resolves_where_it_applies(overrides: list[str], expected: bool) -> None:
    assert_auto_resolves("analytic_grads", overrides, expected)


def test_mlp_grads_are_the_gradients_mlp_backward_sets() -> None:
    torch.manual_seed(4)
    net = mlp(5, [16, 8], 3, "relu", out_std=1.0)
    out, saved = mlp_maths.mlp_forward(net, torch.randn(6, 5))
    grad_out = torch.randn_like(out)
    grads = mlp_maths.mlp_grads(saved, grad_out)
    mlp_maths.mlp_backward(saved, grad_out)
    assert len(grads) == len(list(net.parameters()))
    for p, g in zip(net.parameters(), grads):
        torch.testing.assert_close(g, p.grad, rtol=0, atol=0)


def _compiled_graph_ops(fn, *args: torch.Tensor) -> set[str]:  # noqa: ANN001
    """The ops in the graph ``torch.compile`` traces for ``fn(*args)`` (the graph itself runs eagerly)."""
    ops: set[str] = set()

    def record(gm: torch.fx.GraphModule, _inputs: list[torch.Tensor]):  # noqa: ANN202
        ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=record, dynamic=False)(*args)
    return ops


ATEN_TANH_FROM = TUNING["aten_tanh_min_elements"].default


@pytest.mark.parametrize(("rows", "aten"), [(ATEN_TANH_FROM // 16, True), (ATEN_TANH_FROM // 16 - 1, False)])
def test_a_compiled_cpu_step_calls_atens_tanh_on_large_activations(rows: int, aten: bool) -> None:
    """Under ``aten_tanh``, from ``tuning.aten_tanh_min_elements`` elements the traced step calls
    ATen's tanh kernel as one opaque op (below it, inductor's own)."""
    torch.manual_seed(0)
    net = mlp(4, [16, 16], 2, "tanh", out_std=1.0)
    x = torch.randn(rows, 4)

    def step(x: torch.Tensor) -> list[torch.Tensor]:
        out, saved = mlp_maths.mlp_forward(net, x, ATEN_TANH_FROM)
        return mlp_maths.mlp_grads(saved, torch.ones_like(out))

    with torch.no_grad():
        ops = _compiled_graph_ops(step, x)
        assert ("rlgauge.aten_tanh.default" in ops) is aten
        assert any(op.startswith("<built-in method tanh of") for op in ops) is not aten  # inductor's own
        compiled = torch.compile(step, dynamic=False)(x)
        for got, want in zip(compiled, step(x)):  # sums over ~2k rows, reassociated
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_aten_tanh_is_torch_tanh_outside_a_compiled_step() -> None:
    x = torch.randn(ATEN_TANH_FROM + 5)
    torch.testing.assert_close(mlp_maths.aten_tanh(x), torch.tanh(x), rtol=0, atol=0)
    assert mlp_maths.tanh(x, ATEN_TANH_FROM).equal(torch.tanh(x))


@pytest.mark.slow  # inductor compiles: seconds each with a warm cache
@pytest.mark.parametrize("extra", [[], ["dqn.prioritized_replay=true"]], ids=["uniform", "per"])
def test_the_compiled_dqn_step_gathers_its_minibatch_from_tensor_replay(extra: list[str]) -> None:
    """Under ``gather_in_step`` the compiled hand-written DQN step takes the drawn indices (and PER
    weights) and gathers the minibatch from tensor replay itself; it trains as the step fed a
    gathered minibatch."""
    from value_trainers import make, snapshot

    flags = ["optimizations.analytic_grads=true", "optimizations.compile_train_step=true",
             "optimizations.replay=tensor", *extra]
    runs = []
    for gathers in (True, False):
        t = make("dqn", *flags, f"optimizations.gather_in_step={str(gathers).lower()}")
        batches: list[int] = []
        step = t.learner.step
        t.learner.step = lambda *batch: batches.append(len(batch)) or step(*batch)  # type: ignore[method-assign]
        try:
            assert t.update_path.gathers_in_step is gathers
            for _ in range(2):
                t.iterate()
            assert t.updates > 0 and not t.compile_fallback, getattr(t.update_path.compiled, "reason", "")
            assert set(batches) == ({2 if extra else 1} if gathers else {6 if extra else 5})  # indices (+ weights)
            runs.append(snapshot(t.model))
        finally:
            t.close()
    assert_params_close(runs[0], runs[1], **FP_REORDER)


@pytest.mark.slow  # inductor compiles: seconds each with a warm cache, ~30 s cold on 2 cores
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_compile_train_step_compiles_the_whole_hand_written_step(algo: str) -> None:
    """Under analytic_grads, compile_train_step compiles forward, loss gradient and backward in
    one function (no autograd step to compile), and trains as the eager hand-written step does."""
    from reference_trainers.paths.speedups import CompiledOrEager
    from value_trainers import make, snapshot

    def build(compiled: bool):  # noqa: ANN202
        flags = ["optimizations.analytic_grads=true", f"optimizations.compile_train_step={str(compiled).lower()}"]
        return trainer(*flags) if algo == "ppo" else make("dqn", *flags)

    params = []
    for compiled in (False, True):
        t = build(compiled)
        try:
            assert isinstance(t.update_path.compiled, CompiledOrEager) is compiled
            if compiled:  # as one graph (a break falls back); the Python wrapper unless compile_cpp_wrapper
                assert t.update_path.compiled.compile_kwargs["options"] == {}
                assert t.update_path.compiled.compile_kwargs["fullgraph"] is True
            assert not isinstance(t.learner.loss_and_grads, CompiledOrEager)
            for _ in range(3):
                t.iterate()
            assert t.updates > 0 and not t.compile_fallback, getattr(t.update_path.compiled, "reason", "")
            params.append(snapshot(t.model))
        finally:
            t.close()
    assert_params_close(params[1], params[0], **FP_REORDER)


# --------------------------------------------------------------------------- stacked actor-critic

@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_stacked_mlps_match_the_separate_networks(activation: str) -> None:
    torch.manual_seed(1)
    actor, critic = mlp(4, [32, 32], 3, activation, 0.01), mlp(4, [32, 32], 1, activation, 1.0)
    x = torch.randn(7, 4)
    stacked_actor, stacked_critic = StackedMLPs(actor, critic)(x)
    torch.testing.assert_close(stacked_actor, actor(x).detach(), **FP_REORDER)
    torch.testing.assert_close(stacked_critic, critic(x).detach(), **FP_REORDER)


def test_stacked_mlps_act_through_the_stacked_network_and_drop_it_for_the_update(monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    calls: list[int] = []
    real = StackedMLPs.__call__
    monkeypatch.setattr(StackedMLPs, "__call__", lambda self, x: calls.append(x.shape[0]) or real(self, x))
    t = trainer("optimizations.stacked_mlps=true", "optimizations.lean_rollout=true", "optimizations.batch_inference=true")
    try:
        t.iterate()
        assert calls.count(t.num_envs) == t.config.ppo.num_steps + 1  # every rollout step and the bootstrap value
        assert t.policy.stacked is None  # stale once the update has changed the weights
    finally:
        t.close()


# --------------------------------------------------------------------------- direct fused Adam step

def test_fused_adam_step_matches_the_optimizer() -> None:
    torch.manual_seed(2)
    nets = [mlp(4, [8], 2, "tanh", 1.0) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    optimizers = [torch.optim.Adam(n.parameters(), lr=1e-2, eps=1e-5, fused=True) for n in nets]
    direct = FusedAdamStep(optimizers[1])
    for step in range(6):
        x = torch.randn(5, 4)
        for net in nets:
            net.zero_grad(set_to_none=True)
            net(x).square().sum().backward()
        for opt in optimizers:
            opt.param_groups[0]["lr"] = 1e-2 / (step + 1)  # annealed between steps, as PPO does
        optimizers[0].step()
        direct()
        for a, b in zip(nets[0].parameters(), nets[1].parameters()):
            assert torch.equal(a, b)
    assert direct._state is not None  # the direct path was taken after the first step
    counters = [optimizers[1].state[p]["step"] for p in nets[1].parameters()]
    assert len({c.untyped_storage().data_ptr() for c in counters}) == 1  # one tensor, advanced by one add
    assert [float(c) for c in counters] == [6.0] * len(counters)
    assert all(torch.equal(a, b) for a, b in zip(optimizers[0].state_dict()["state"][0].values(),
                                                 optimizers[1].state_dict()["state"][0].values()))
    state = copy.deepcopy(optimizers[0].state_dict())  # as from a file: tensors of its own
    optimizers[1].load_state_dict(state)
    direct.refresh()
    assert direct._state is None
    for step in range(2):  # after a load: the loaded counters, shared again, go on
        x = torch.randn(5, 4)
        for net in nets:
            net.zero_grad(set_to_none=True)
            net(x).square().sum().backward()
        optimizers[0].step()
        direct()
        for a, b in zip(nets[0].parameters(), nets[1].parameters()):
            assert torch.equal(a, b)
    assert [float(optimizers[1].state[p]["step"]) for p in nets[1].parameters()] == [8.0] * 4
