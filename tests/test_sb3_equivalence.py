"""Our PPO against Stable-Baselines3's, piece by piece, on the matched preset: the same weights and
the same rollout give the same update, and the same weights, env seeds and actions collect the same
rollout. Together they say the two differ only in their random draws (initial weights, sampled
actions, minibatch order), so a learning gap between them is chance or a bug that these catch."""

from __future__ import annotations

from collections import deque
from typing import Any
import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from harness.specs.peers.sb3 import SB3Trainer, make_trainer, peer_settings  # noqa: E402
from harness.specs.presets import specs_for  # noqa: E402
from reference_trainers.config.resolve import resolve_config  # noqa: E402
from reference_trainers.value.loop import linear_epsilon  # noqa: E402
from reference_trainers.value.dqn import DQNTrainer  # noqa: E402
from reference_trainers.ppo.trainer import PPOTrainer  # noqa: E402

PRESET = "ppo-cartpole-sb3"
SHORT_EPISODES = "env.kwargs={max_episode_steps: 30}"  # truncations every few dozen steps, under either library
SAME_WEIGHTS = 2e-7  # float32 rounding of the same sums in another order, on weights below 1


def build(variant: str, overrides: list[str]) -> tuple[PPOTrainer, SB3Trainer]:
    res = resolve_config(specs_for(PRESET, variant, ["device=cpu", *overrides])[0].config)
    peer = make_trainer(peer_settings(res.config), device="cpu", seed=res.config.seed)
    return PPOTrainer(res.config, resolution=res), peer


def layer_pairs(ours: PPOTrainer, peer: SB3Trainer) -> list[tuple[torch.nn.Linear, torch.nn.Linear]]:
    """Our actor and critic layers beside SB3's (separate 64x64 MLPs and their heads)."""
    policy = peer.model.policy
    actor, critic = ours.model.actor, ours.model.critic
    return [(actor[0], policy.mlp_extractor.policy_net[0]), (actor[2], policy.mlp_extractor.policy_net[2]),
            (actor[4], policy.action_net), (critic[0], policy.mlp_extractor.value_net[0]),
            (critic[2], policy.mlp_extractor.value_net[2]), (critic[4], policy.value_net)]


def copy_layers(pairs: list[tuple[torch.nn.Linear, torch.nn.Linear]], ours: Any, peer: SB3Trainer) -> None:
    """SB3's weights and their Adam moments into our layers and optimiser (``pairs``: ours, SB3's)."""
    sb3_optimizer, our_optimizer = peer.model.policy.optimizer, ours.learner.optimizer
    with torch.no_grad():
        for mine, theirs in pairs:
            for a, b in ((mine.weight, theirs.weight), (mine.bias, theirs.bias)):
                a.copy_(b)
                if b in sb3_optimizer.state:
                    our_optimizer.state[a] = {k: v.clone() for k, v in sb3_optimizer.state[b].items()}


def assert_same_layers(pairs: list[tuple[torch.nn.Linear, torch.nn.Linear]]) -> None:
    for mine, theirs in pairs:
        torch.testing.assert_close(mine.weight, theirs.weight, atol=SAME_WEIGHTS, rtol=0)
        torch.testing.assert_close(mine.bias, theirs.bias, atol=SAME_WEIGHTS, rtol=0)


def adopt_sb3_state(ours: PPOTrainer, peer: SB3Trainer) -> None:
    """Copy SB3's PPO weights and Adam moments into our model and optimiser."""
    copy_layers(layer_pairs(ours, peer), ours, peer)
    ours._drop_snapshots()


def sb3_iterations(peer: SB3Trainer, count: int) -> None:
    m = peer.model
    for _ in range(count):
        m.collect_rollouts(m.env, peer.callback, m.rollout_buffer, n_rollout_steps=m.n_steps)
        m.train()


def load_sb3_rollout(ours: PPOTrainer, peer: SB3Trainer) -> None:
    """SB3's last rollout in our buffers. SB3 folds a truncated step's bootstrap into its reward and
    has no reset steps, so every row is valid and every episode end is a termination here."""
    rb, m = peer.model.rollout_buffer, peer.model
    ends = np.zeros_like(rb.episode_starts)
    ends[:-1] = rb.episode_starts[1:]
    ends[-1] = m._last_episode_starts
    as_f32 = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
    ours.obs_buf.copy_(as_f32(rb.observations))
    ours.actions_buf.copy_(torch.as_tensor(rb.actions[..., 0]).long())
    ours.logprobs_buf.copy_(as_f32(rb.log_probs))
    ours.values_buf.copy_(as_f32(rb.values))
    ours.rewards_buf.copy_(as_f32(rb.rewards))
    ours.terminated_buf.copy_(as_f32(ends))
    ours.truncated_buf.zero_()
    ours.valid_buf.fill_(1.0)
    ours.next_obs = np.array(m._last_obs)


def update_both_in_one_order(ours: PPOTrainer, peer: SB3Trainer, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """SB3's ``train()`` and our ``update()`` on the loaded rollout, taking the same minibatches in the
    same order; returns the largest weight gap per layer afterwards."""
    m = peer.model
    # SB3 flattens (T, N) env-major (n * T + t), ours time-major (t * N + n)
    T, N = m.n_steps, m.n_envs
    orders = [np.random.RandomState(epoch).permutation(T * N) for epoch in range(m.n_epochs)]
    sb3_orders, our_orders = deque(orders), deque(torch.as_tensor((o % T) * N + o // T) for o in orders)
    with monkeypatch.context() as patch:
        patch.setattr(np.random, "permutation", lambda n: sb3_orders.popleft())
        patch.setattr(torch, "randperm", lambda *a, **k: our_orders.popleft())
        m.train()
        ours.update()
    assert not sb3_orders and not our_orders, "both took one permutation per epoch"
    return [float((mine.weight - theirs.weight).detach().abs().max()) for mine, theirs in layer_pairs(ours, peer)]


@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_our_update_equals_sb3s_on_the_same_rollout_weights_and_minibatch_order(
        variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ours, peer = build(variant, [SHORT_EPISODES])
    try:
        sb3_iterations(peer, 3)  # Adam moments that are not zero
        adopt_sb3_state(ours, peer)
        m = peer.model
        m.collect_rollouts(m.env, peer.callback, m.rollout_buffer, n_rollout_steps=m.n_steps)
        load_sb3_rollout(ours, peer)
        assert ours.terminated_buf.sum() > 0, "the rollout should hold episode ends"

        with torch.no_grad():
            next_value = ours.model(torch.as_tensor(ours.next_obs, dtype=torch.float32))[1]
        advantages, returns = ours.gae(ours.rewards_buf, ours.values_buf, next_value, ours.terminated_buf,
                                       ours.truncated_buf, ours.valid_buf, ours.config.ppo.gamma,
                                       ours.config.ppo.gae_lambda)
        torch.testing.assert_close(advantages, torch.as_tensor(m.rollout_buffer.advantages), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(returns, torch.as_tensor(m.rollout_buffer.returns), atol=1e-5, rtol=1e-5)

        update_both_in_one_order(ours, peer, monkeypatch)
        assert_same_layers(layer_pairs(ours, peer))
    finally:
        ours.close()
        peer.close()


def test_the_update_check_sees_a_changed_hyper_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above is sharp: our update with another entropy coefficient no longer matches."""
    ours, peer = build("baseline", [SHORT_EPISODES, "ppo.ent_coef=0.02"])
    try:
        peer.model.ent_coef = 0.01  # SB3 keeps the preset's value
        sb3_iterations(peer, 3)
        adopt_sb3_state(ours, peer)
        m = peer.model
        m.collect_rollouts(m.env, peer.callback, m.rollout_buffer, n_rollout_steps=m.n_steps)
        load_sb3_rollout(ours, peer)
        gaps = update_both_in_one_order(ours, peer, monkeypatch)
        assert max(gaps) > 10 * SAME_WEIGHTS, gaps
    finally:
        ours.close()
        peer.close()


def test_our_rollout_collects_what_sb3_collects_for_the_same_weights_seeds_and_actions() -> None:
    ours, peer = build("baseline", [SHORT_EPISODES])
    try:
        adopt_sb3_state(ours, peer)
        m, c = peer.model, ours.config
        T, N = m.n_steps, m.n_envs
        assert np.array_equal(m._last_obs, ours.next_obs), "both reset sub-env i with seed + i"
        keys = ("obs_buf", "actions_buf", "logprobs_buf", "values_buf", "rewards_buf", "terminated_buf",
                "truncated_buf", "valid_buf")
        rollouts = []
        for _ in range(2):  # ours spends a step per episode on the reset: two rollouts hold one of SB3's
            ours.collect()
            rollouts.append({k: getattr(ours, k).clone() for k in keys})
        data = {k: torch.cat([r[k] for r in rollouts]) for k in keys}
        with torch.no_grad():
            next_value = ours.model(torch.as_tensor(ours.next_obs, dtype=torch.float32))[1]
        valid = data["valid_buf"].bool()
        assert (~valid).any() and data["truncated_buf"].any(), "reset steps and truncations both occur"

        # SB3 acts with our actions (its own values and log-probabilities), sub-env by sub-env in order
        queues = [deque(data["actions_buf"][valid[:, n], n].tolist()) for n in range(N)]
        policy = m.policy

        def forced(obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, ...]:
            actions = torch.as_tensor([queues[n].popleft() for n in range(N)])
            values, log_prob, _ = policy.evaluate_actions(obs, actions)
            return actions, values, log_prob

        policy.forward = forced
        m.collect_rollouts(m.env, peer.callback, m.rollout_buffer, n_rollout_steps=T)
        rb = m.rollout_buffer
        values_after = torch.cat([data["values_buf"], next_value.unsqueeze(0)])
        for n in range(N):
            rows = valid[:, n].nonzero().squeeze(1)[:T]
            ours_env = {k: data[k][rows, n] for k in keys}
            np.testing.assert_array_equal(ours_env["obs_buf"].numpy(), rb.observations[:, n])
            np.testing.assert_allclose(ours_env["values_buf"].numpy(), rb.values[:, n], atol=1e-5)
            np.testing.assert_allclose(ours_env["logprobs_buf"].numpy(), rb.log_probs[:, n], atol=1e-5)
            # SB3 adds gamma * V(final observation) to a truncated step's reward; ours reads that value
            # from the reset step that follows (the final observation is what it acts on)
            truncated = ours_env["truncated_buf"] * (1 - ours_env["terminated_buf"])
            folded = ours_env["rewards_buf"] + c.ppo.gamma * values_after[rows + 1, n] * truncated
            np.testing.assert_allclose(folded.numpy(), rb.rewards[:, n], atol=1e-5)
            ends = (ours_env["terminated_buf"] + ours_env["truncated_buf"]).clamp(max=1)
            np.testing.assert_array_equal(ends[:-1].numpy(), rb.episode_starts[1:, n])
    finally:
        ours.close()
        peer.close()


def dqn_layer_pairs(ours: Any, peer: SB3Trainer) -> list[tuple[torch.nn.Linear, torch.nn.Linear]]:
    """Our Q-network's and target network's layers beside SB3's (120-84 ReLU MLP)."""
    pairs = []
    for mine, theirs in ((ours.model.net, peer.model.q_net.q_net), (ours.target.net, peer.model.q_net_target.q_net)):
        linear = [layer for layer in mine if isinstance(layer, torch.nn.Linear)]
        pairs += zip(linear, [layer for layer in theirs if isinstance(layer, torch.nn.Linear)])
    return pairs


@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_our_dqn_update_equals_sb3s_on_the_same_batch_and_weights(variant: str) -> None:
    res = resolve_config(specs_for("dqn-cartpole-sb3", variant, ["device=cpu", "dqn.learning_starts=256"])[0].config)
    peer = make_trainer(peer_settings(res.config), device="cpu", seed=res.config.seed)
    ours = DQNTrainer(res.config, resolution=res)
    try:
        m = peer.model
        for _ in range(2):  # a replay that holds episode ends, and Adam moments that are not zero
            peer.iterate()
        copy_layers(dqn_layer_pairs(ours, peer), ours, peer)
        sample = m.replay_buffer.sample(m.batch_size)
        assert sample.dones.any(), "the batch should hold terminations"
        m.replay_buffer.sample = lambda *args, **kwargs: sample
        m.train(gradient_steps=1, batch_size=m.batch_size)
        bootstrap = res.config.dqn.gamma * (1.0 - sample.dones.squeeze(1))
        ours.learner.step(sample.observations, sample.actions.squeeze(1).long(), sample.rewards.squeeze(1),
                          sample.next_observations, bootstrap)
        assert_same_layers(dqn_layer_pairs(ours, peer))
    finally:
        ours.close()
        peer.close()


def test_our_epsilon_schedule_is_sb3s() -> None:
    res = resolve_config(specs_for("dqn-cartpole-sb3", "baseline", ["device=cpu"])[0].config)
    peer = make_trainer(peer_settings(res.config), device="cpu", seed=res.config.seed)
    try:
        hp, m = res.config.dqn, peer.model
        for step in (0, 1_000, 5_000, 9_999, 10_000, 50_000):
            ours = linear_epsilon(step, hp.start_epsilon, hp.end_epsilon, hp.exploration_steps)
            assert m.exploration_schedule(1.0 - step / peer.total_timesteps) == pytest.approx(ours, abs=1e-6)
    finally:
        peer.close()
