"""The loop shared by the value-based trainers (DQN, IQN).

Epsilon-greedy acting; each vector-env step's transitions go through a 1- or n-step writer
into replay; every ``train_frequency`` vector steps (once ``learning_starts`` agent steps are
collected) ``gradient_steps`` minibatches are sampled and handed to the shared ``Learner``;
the target network follows every ``target_update_interval`` optimiser steps. An algorithm
(``dqn.py``, ``iqn.py``) supplies its network, its greedy Q-values and its loss.

Autoreset is gymnasium's NEXT_STEP on every backend: the step after an episode ends returns
the reset observation, is not a transition and is never written to replay.
Phases: replay inserts and minibatch sampling count as ``transfer`` (they move transitions
to the device), the optimiser step and the target update as ``update``. With
``optimizations.num_workers`` > 0 the minibatches of an update phase (``gradient_steps``) are
gathered on background threads while earlier ones train; ``transfer`` then counts the wait.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from reference_trainers.runtime import distributed
from reference_trainers.nets.mlp import NumpyMLP, aten_tanh_from
from reference_trainers.replay.buffers import Sample, make_replay
from reference_trainers.config.schema import TrainConfig, ValueConfig
from reference_trainers.envs.factory import frames_in_step, open_vector_env
from reference_trainers.envs.episodes import EpisodeTracker
from reference_trainers.paths.learner import Learner, apply_process_settings, fell_back, maybe_compile
from reference_trainers.replay.writers import make_writer
from reference_trainers.paths.acting import choose_acting
from reference_trainers.paths.numpy_acting import chunk_rows
from reference_trainers.paths.prefetch import Prefetcher
from reference_trainers.runtime.probe import NullProbe, Probe
from reference_trainers.config.resolve import Resolution, resolve_config
from reference_trainers.paths.speedups import HostToDevice
from reference_trainers.runtime.trainer import IterationResult
from reference_trainers.state.trainer_state import Checkpointable
from reference_trainers.value.acting import ActingNoise, EpsilonGreedy, HostNoise, NumpyEpsilonGreedy
from reference_trainers.value.updates import choose_update

__all__ = ["ActingNoise", "HostNoise", "ValueTrainer", "linear_epsilon"]


def linear_epsilon(agent_steps: int, start: float, end: float, steps: int) -> float:
    """Epsilon decayed linearly from ``start`` to ``end`` over ``steps`` agent steps, then held."""
    return start + min(1.0, agent_steps / steps) * (end - start)


class ValueTrainer(Checkpointable):
    """Build envs, online and target networks, learner, replay and writer; ``iterate()`` runs
    ``log_interval`` agent steps with their updates. Subclasses define ``algo``,
    ``build_network``, ``q_values``, ``train_batch`` and ``loss`` (DQN also ``td_gradient``, for the
    hand-written update paths of ``value.updates``).

    Under ``distributed.enabled`` each rank keeps its own replay buffer and writer; DDP
    averages the gradients, so the networks stay identical on every rank."""

    algo = ""
    COUNTERS = ("env_steps", "agent_steps", "vector_steps", "updates", "iterations")

    def __init__(self, config: TrainConfig, probe: Probe | None = None, resolution: Resolution | None = None) -> None:
        res = resolution or resolve_config(config)
        self.config, self.device, self.reasons = res.config, res.device, res.reasons
        self.probe: Probe = probe or NullProbe()
        c, o = self.config, self.config.optimizations
        self.hp: ValueConfig = getattr(c, self.algo)
        distributed.join(c.distributed, self.device)
        seed = distributed.rank_seed(c.seed, c.env.num_envs)
        torch.manual_seed(c.seed)  # the network starts alike on every rank
        generator = lambda offset: torch.Generator(device=self.device).manual_seed(seed + offset)  # noqa: E731
        self.explore_generator = generator(0)  # epsilon draws
        self.action_generator = generator(1)   # random actions
        self.tau_generator = generator(2)      # IQN: fractions for acting
        self.update_generator = generator(3)   # IQN: fractions for the loss

        opened = open_vector_env(c.env, seed, c.model.body)
        self.envs, self.next_obs, self.num_envs = opened.envs, opened.next_obs, c.env.num_envs
        self.obs_dim, self.frames, self.obs_shape = opened.obs_dim, opened.frames, opened.obs_shape
        self.num_actions = int(self.envs.single_action_space.n)
        self.model = self.build_network(self.obs_shape, self.num_actions).to(self.device)
        self.target = copy.deepcopy(self.model).requires_grad_(False)

        # optimisations, each picking one path
        self.aten_tanh_from = aten_tanh_from(c)  # aten_tanh: ATen's tanh on large activations of the hand-written step
        # update: autograd, hand-written (eager or compiled whole) or NumPy, chosen once; the learner's loss closure
        self.update_path = choose_update(self, o)
        self.learner = Learner(self.model, self.update_path, c, self.device, self.hp.learning_rate, self.hp.adam_eps,
                               sets_grads=self.update_path.sets_grads)
        self.forward = maybe_compile(self.learner.train_model, o)
        self.target_forward = maybe_compile(self.target, o, "target_model")
        self.to_device = HostToDevice(self.device, pinned=o.pinned_memory, non_blocking=o.non_blocking,
                                      uint8=bool(o.uint8_transfer))
        self.replay_generator = generator(4)
        self.replay = make_replay(o.replay, self.hp.buffer_size, self.obs_dim, self.device, self.to_device,
                                  self.replay_generator, self.hp.prioritized_replay, self.hp.per_alpha, self.hp.per_eps,
                                  frame_shape=self.obs_shape if self.frames else None)
        self.writer = make_writer(self.num_envs, self.hp.gamma, self.hp.n_step, self.obs_shape,
                                  np.uint8 if self.frames else np.float32)
        self.prefetcher = Prefetcher(o.num_workers)
        # acting: epsilon-greedy, batched per sub-env, for all of them, or in NumPy (chosen once)
        self.policy = EpsilonGreedy(self, self.learner.autocast, self.to_device, self.explore_generator,
                                    self.action_generator, self.device, self.num_envs, self.num_actions, self.obs_shape,
                                    self.epsilon)
        self.inference_chunk = chunk_rows(o.batch_inference, o.inference_batch_size, self.num_envs)
        # numpy_acting: the Q-network's NumPy forward (live weights) and its draws (block_noise: a block of steps)
        self.numpy_path: NumpyEpsilonGreedy | None = None
        if o.numpy_acting:
            block = c.tuning.noise_block_steps if o.block_noise else 1
            noise = HostNoise(self.num_envs, self.num_actions, self.explore_generator, self.action_generator, block)
            self.numpy_path = NumpyEpsilonGreedy(self._host_q_network(), noise, self.probe, self.num_envs,
                                                 self.inference_chunk, self.epsilon)
        self.act = choose_acting(self.policy, self.num_envs, self.probe, o.batch_inference, o.inference_batch_size,
                                 self.numpy_path)

        self.tracker = EpisodeTracker(self.num_envs, window=c.run.return_window)
        self.episode_over = np.zeros(self.num_envs, dtype=bool)  # the next step of this sub-env is a reset step
        self.any_episode_over = False
        # replay_direct_write: a step with no reset row goes straight into the CPU tensor replay (resolve
        # allows it with a one-step writer and uniform sampling); plain: the writer's batch, then ``add``
        self.direct_write = bool(o.replay_direct_write)
        self.env_steps = self.agent_steps = self.vector_steps = self.updates = self.iterations = 0
        self.replay_ready = False  # every rank holds batch_size transitions (never false again once true)
        self.last_stats: dict[str, float] = {}

    # ----------------------------------------------------------------- the algorithm's part
    @abc.abstractmethod
    def build_network(self, obs_shape: tuple[int, ...], num_actions: int) -> nn.Module:
        """The online network; the target network is a copy of it."""

    @abc.abstractmethod
    def q_values(self, obs: torch.Tensor, fractions: torch.Tensor | None = None) -> torch.Tensor:
        """Q-values (rows, actions) for acting; called under no_grad and autocast.

        ``fractions``: the rows' slice of ``acting_fractions`` (IQN's quantile fractions), else None.
        """

    def acting_fractions(self, rows: int) -> torch.Tensor | None:
        """Random inputs of the acting network for ``rows`` sub-envs (IQN's fractions); None for DQN."""
        return None

    @abc.abstractmethod
    def train_batch(self, sample: Sample) -> tuple[torch.Tensor, ...]:
        """The tensors ``loss`` takes for one minibatch."""

    @abc.abstractmethod
    def loss(self, *batch: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Scalar loss and stats; ``stats['priority']`` (per sample) feeds prioritized replay."""

    def td_gradient(self, *batch: torch.Tensor) -> tuple[list, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``analytic_grads``: forward, loss and the loss's gradient with respect to the network's
        output, for ``mlp_backward`` (the forward's saved activations, that gradient, loss, stats)."""
        raise NotImplementedError(f"{self.algo} has no hand-written gradients (the registry limits analytic_grads)")

    # ----------------------------------------------------------------- checkpoints
    def rng_generators(self) -> dict[str, torch.Generator]:
        return {"explore": self.explore_generator, "action": self.action_generator, "tau": self.tau_generator,
                "update": self.update_generator, "replay": self.replay_generator}

    def extra_state(self) -> dict[str, Any]:
        """Target network, replay contents (and PER priorities), the n-step writer's pending steps,
        the acting draws not yet used (``numpy_acting``)."""
        state = {"target": self.target.state_dict(), "replay": self.replay.state_dict(),
                 "writer": self.writer.state_dict(), "replay_ready": self.replay_ready}
        if self.numpy_path is not None:
            state["host_noise"] = self.numpy_path.noise.state_dict()
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        if self.numpy_path is not None:  # the weights were loaded in place; view them again all the same
            self.numpy_path.q_network = self._host_q_network()
        self.target.load_state_dict(state["target"])
        self.replay.load_state_dict(state["replay"])
        self.writer.load_state_dict(state["writer"])
        self.replay_ready = bool(state["replay_ready"])
        self.any_episode_over = bool(self.episode_over.any())  # restored before the extra state
        if self.numpy_path is not None and "host_noise" in state:
            self.numpy_path.noise.load_state_dict(state["host_noise"])

    # ----------------------------------------------------------------- acting
    def epsilon(self) -> float:
        hp = self.hp
        return linear_epsilon(self.agent_steps, hp.start_epsilon, hp.end_epsilon, hp.exploration_steps)

    def _host_q_network(self) -> NumpyMLP:
        """``numpy_acting``: the Q-network's MLP as a NumPy forward over zero-copy views of its weights."""
        return NumpyMLP.of(self.model.net)  # the registry limits numpy_acting to MLP Q-networks

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        """One epsilon-greedy action selection for ``num_envs`` observations (host in, host out)."""
        return self.act(obs).host_actions

    # ----------------------------------------------------------------- collect
    def _env_step(self) -> int:
        """One vector-env step; its transitions go to replay. Returns the frames it took."""
        probe, n = self.probe, self.num_envs
        obs = self.next_obs
        actions = self.act(obs).host_actions
        with probe.phase("env"):
            self.next_obs, reward, terminated, truncated, info = self.envs.step(actions)
        with probe.phase("transfer"):
            # replay_direct_write: a step with no reset row straight into replay (not across the ring's end)
            if not (self.direct_write and not self.any_episode_over and self.replay.add_one_step(
                    obs, actions, reward, self.next_obs, terminated, self.writer.gamma)):
                shape = self.obs_shape
                batch = self.writer.push(obs.reshape(n, *shape), actions, reward, self.next_obs.reshape(n, *shape),
                                         terminated, truncated, ~self.episode_over)
                self.replay.add(batch)
        with probe.phase("logging"):
            frames = frames_in_step(info, n, self.episode_over if self.any_episode_over else None)
            self.episode_over = terminated | truncated
            self.any_episode_over = bool(self.episode_over.any())
            self.tracker.update(reward, terminated, truncated, self.episode_over, self.any_episode_over)
        self.vector_steps += 1
        self.agent_steps += n
        self.env_steps += frames
        return frames

    # ----------------------------------------------------------------- update
    def _updates_due(self) -> int:
        hp = self.hp
        if self.vector_steps % hp.train_frequency or self.agent_steps < hp.learning_starts:
            return 0
        if not self.replay_ready:  # agreed over the ranks, so that all of them update together
            self.replay_ready = distributed.agreed_min(len(self.replay)) >= hp.batch_size
        return hp.gradient_steps if self.replay_ready else 0

    def _beta(self) -> float:
        hp = self.hp
        return hp.per_beta + min(1.0, self.agent_steps / hp.per_beta_steps) * (1.0 - hp.per_beta)

    def _draws(self, count: int) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """Minibatch indices (and PER weights) for ``count`` updates, drawn lazily in order."""
        for _ in range(count):
            yield self.replay.draw(self.hp.batch_size, self._beta())

    def _update_phase(self, count: int) -> None:
        """``count`` optimiser steps; their minibatches are gathered inline, ahead on the
        prefetcher's threads (``num_workers``) while earlier steps train, or inside the compiled
        step (``gather_in_step``: it takes the drawn indices)."""
        if self.update_path.gathers_in_step:
            for _ in range(count):
                with self.probe.phase("transfer"):
                    indices, weights = self.replay.draw(self.hp.batch_size, self._beta())
                self._learn((indices,) if weights is None else (indices, weights), indices)
            return
        gather = self.replay.host_gather if self.update_path.host_minibatches else self.replay.gather
        samples = self.prefetcher.map(lambda drawn: gather(*drawn), self._draws(count))
        while True:
            with self.probe.phase("transfer"):
                sample = next(samples, None)
            if sample is None:
                return
            self._learn(self.train_batch(sample), sample.indices)

    def _learn(self, batch: tuple[torch.Tensor, ...], indices: torch.Tensor) -> None:
        """One optimiser step on ``batch`` (what the loss closure takes), the priorities of the
        replay ``indices`` it came from, and the target network when due."""
        hp = self.hp
        with self.probe.phase("update"):
            stats = self.learner.step(*batch)
            if hp.prioritized_replay:
                self.replay.update_priorities(indices, stats["priority"])
            self.updates += 1
            if self.updates % hp.target_update_interval == 0:
                self.update_target()

    def update_target(self) -> None:
        """Hard copy (``tau: 1``) or Polyak averaging of the online into the target network, in place."""
        tau = self.hp.tau
        with torch.no_grad():
            for target, online in zip(self.target.parameters(), self.model.parameters()):
                if tau == 1.0:
                    target.copy_(online)
                else:
                    target.lerp_(online, tau)

    # ----------------------------------------------------------------- loop
    def iterate(self) -> IterationResult:
        """``log_interval`` agent steps with the updates they are due; returns what it did."""
        self.activate()
        frames = decisions = updates = 0
        while decisions < self.hp.log_interval:
            frames += self._env_step()
            decisions += self.num_envs
            due = self._updates_due()
            if due:
                self._update_phase(due)
            updates += due
        with self.probe.phase("logging"):
            self.last_stats = self.learner.flush(updates, self.iterations + 1)
            self.last_stats["epsilon"] = self.epsilon()
        self.iterations += 1
        return IterationResult(frames, decisions, updates)

    def activate(self) -> None:
        """Apply this trainer's process-wide settings (precision, threads) before it runs."""
        apply_process_settings(self.config.optimizations)

    @property
    def nonfinite_events(self) -> int:
        return self.learner.nonfinite_events

    @property
    def compile_fallback(self) -> bool:
        return fell_back(self.forward, self.target_forward, self.learner.loss_and_grads, self.update_path.compiled)

    def mean_recent_return(self) -> float | None:
        return self.tracker.mean_recent()

    def close(self) -> None:
        self.prefetcher.close()
        self.envs.close()
