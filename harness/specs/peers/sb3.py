"""Stable-Baselines3 PPO and DQN as a peer: same env, matched hyper-parameters, the public trainer contract.

``matching(config)`` is the explicit table (our key -> SB3 argument) that builds the SB3
model; settings without an SB3 counterpart (double Q, n-step, prioritized replay, IQN)
are refused with a clear error rather than silently dropped. SB3 runs as its users run it:
``make_vec_env`` (a ``DummyVecEnv`` of Monitor-wrapped envs) and its own
``collect_rollouts`` / ``train``. Phases: env steps (``step_wait``) are ``env``, the
policy call while collecting is ``inference``, ``train()`` is ``update``; buffer and
bookkeeping work falls outside the named phases. The peer is built on the contract any user's
trainer follows (``make_trainer(config, *, device, seed, probe)``, ``iterate()``, ``close()``),
from plain settings (``peer_settings``), and measured through the same adapter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from stable_baselines3 import DQN, PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import VecEnvWrapper
from torch import nn

from reference_trainers import IterationResult
from reference_trainers.config.schema import TrainConfig
from reference_trainers.runtime.probe import NullProbe, Probe

from harness.errors import UserError

FAR_FUTURE = 10**12
"""``total_timesteps`` for schedules that our configs express in steps rather than as a fraction."""
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


@dataclass(frozen=True)
class Match:
    """One row of the matching table."""

    ours: str
    our_value: Any
    sb3: str
    sb3_value: Any
    note: str = ""


def _grad_norm(config: TrainConfig) -> float:
    return math.inf if config.stability.max_grad_norm is None else config.stability.max_grad_norm


def _ppo_matching(c: TrainConfig) -> list[Match]:
    p, n = c.ppo, c.env.num_envs
    if p.clip_vloss:  # SB3 clips the value prediction alone; ours takes the larger of clipped and unclipped losses
        raise UserError("--peer sb3: ppo.clip_vloss=true has no SB3 counterpart (SB3's clip_range_vf clips the value "
                        "prediction, without the max of clipped and unclipped losses); accepted with --peer sb3: "
                        "ppo.clip_vloss=false")
    batch = n * p.num_steps
    lr = p.learning_rate
    return [
        Match("env.id", c.env.id, "env", c.env.id, "make_vec_env: DummyVecEnv + Monitor"),
        Match("env.num_envs", n, "n_envs", n),
        Match("ppo.num_steps", p.num_steps, "n_steps", p.num_steps),
        Match("ppo.num_minibatches", p.num_minibatches, "batch_size", batch // p.num_minibatches,
              "num_envs * num_steps / num_minibatches"),
        Match("ppo.update_epochs", p.update_epochs, "n_epochs", p.update_epochs),
        Match("ppo.learning_rate", lr, "learning_rate", f"{lr} * progress" if p.anneal_lr else lr),
        Match("ppo.anneal_lr / anneal_steps", f"{p.anneal_lr} / {p.anneal_steps}", "total_timesteps",
              p.anneal_steps if p.anneal_lr else FAR_FUTURE, "the linear schedule's horizon"),
        Match("ppo.gamma", p.gamma, "gamma", p.gamma),
        Match("ppo.gae_lambda", p.gae_lambda, "gae_lambda", p.gae_lambda),
        Match("ppo.clip_coef", p.clip_coef, "clip_range", p.clip_coef),
        Match("ppo.clip_vloss", p.clip_vloss, "clip_range_vf", None, "the value loss unclipped in both"),
        Match("ppo.ent_coef", p.ent_coef, "ent_coef", p.ent_coef),
        Match("ppo.vf_coef", p.vf_coef, "vf_coef", p.vf_coef / 2,
              "ours: vf_coef x 0.5 x squared error (CleanRL); SB3: vf_coef x squared error"),
        Match("ppo.norm_adv", p.norm_adv, "normalize_advantage", p.norm_adv),
        Match("stability.max_grad_norm", c.stability.max_grad_norm, "max_grad_norm", _grad_norm(c)),
        Match("ppo.adam_eps", p.adam_eps, "policy_kwargs.optimizer_kwargs.eps", p.adam_eps),
        Match("model.hidden_sizes", c.model.hidden_sizes, "policy_kwargs.net_arch",
              {"pi": c.model.hidden_sizes, "vf": c.model.hidden_sizes}, "separate actor and critic MLPs"),
        Match("model.activation", c.model.activation, "policy_kwargs.activation_fn", ACTIVATIONS[c.model.activation].__name__),
        Match("model.init", c.model.init, "policy_kwargs.ortho_init", c.model.init == "orthogonal",
              "orthogonal: gains sqrt(2), 0.01 policy head, 1.0 value head, zero biases in both"),
        Match("seed", c.seed, "seed", c.seed),
        Match("device", c.device, "device", c.device),
    ]


def _dqn_matching(c: TrainConfig) -> list[Match]:
    d, n = c.dqn, c.env.num_envs
    for key, value, plain in (("double_q", d.double_q, False), ("n_step", d.n_step, 1),
                              ("prioritized_replay", d.prioritized_replay, False)):
        if value != plain:
            raise UserError(f"--peer sb3: dqn.{key}={value} has no SB3 DQN counterpart; "
                            f"accepted with --peer sb3: dqn.{key}={str(plain).lower()}")
    if c.model.init != "torch_default":
        raise UserError(f"--peer sb3: model.init={c.model.init} has no SB3 DQN counterpart (SB3's Q-network keeps "
                        "nn.Linear's own initialisation); accepted with --peer sb3: model.init=torch_default")
    target_steps = d.target_update_interval * d.train_frequency * n // d.gradient_steps
    return [
        Match("env.id", c.env.id, "env", c.env.id, "make_vec_env: DummyVecEnv + Monitor"),
        Match("env.num_envs", n, "n_envs", n),
        Match("dqn.learning_rate", d.learning_rate, "learning_rate", d.learning_rate),
        Match("dqn.buffer_size", d.buffer_size, "buffer_size", d.buffer_size),
        Match("dqn.batch_size", d.batch_size, "batch_size", d.batch_size),
        Match("dqn.learning_starts", d.learning_starts, "learning_starts", d.learning_starts),
        Match("dqn.train_frequency", d.train_frequency, "train_freq", (d.train_frequency, "step"), "vector steps"),
        Match("dqn.gradient_steps", d.gradient_steps, "gradient_steps", d.gradient_steps),
        Match("dqn.target_update_interval", d.target_update_interval, "target_update_interval", target_steps,
              "ours: optimiser steps; SB3: env transitions (x train_frequency x num_envs / gradient_steps)"),
        Match("dqn.tau", d.tau, "tau", d.tau),
        Match("dqn.gamma", d.gamma, "gamma", d.gamma),
        Match("dqn.start_epsilon", d.start_epsilon, "exploration_initial_eps", d.start_epsilon),
        Match("dqn.end_epsilon", d.end_epsilon, "exploration_final_eps", d.end_epsilon),
        Match("dqn.exploration_steps", d.exploration_steps, "exploration_fraction", d.exploration_steps / FAR_FUTURE,
              f"of total_timesteps={FAR_FUTURE}"),
        Match("dqn.double_q", d.double_q, "(none)", False, "SB3 DQN is single Q"),
        Match("stability.max_grad_norm", c.stability.max_grad_norm, "max_grad_norm", _grad_norm(c)),
        Match("dqn.adam_eps", d.adam_eps, "policy_kwargs.optimizer_kwargs.eps", d.adam_eps),
        Match("model.hidden_sizes", c.model.hidden_sizes, "policy_kwargs.net_arch", c.model.hidden_sizes),
        Match("model.init", c.model.init, "(Q-network init)", "torch_default", "SB3's DQN keeps nn.Linear's own"),
        Match("(loss)", "smooth L1 (Huber, beta 1)", "(loss)", "smooth_l1_loss", "the same TD loss"),
        Match("model.activation", c.model.activation, "policy_kwargs.activation_fn", ACTIVATIONS[c.model.activation].__name__),
        Match("seed", c.seed, "seed", c.seed),
        Match("device", c.device, "device", c.device),
    ]


def matching(config: TrainConfig) -> list[Match]:
    """The matching table for ``config`` (resolved); ``UserError`` for what SB3 cannot match."""
    if config.algo == "ppo":
        return _ppo_matching(config)
    if config.algo == "dqn":
        return _dqn_matching(config)
    raise UserError(f"--peer sb3: no SB3 counterpart for algo {config.algo!r}; accepted: presets of algo ppo or dqn")


class _TimedVecEnv(VecEnvWrapper):
    """Charges the wrapped VecEnv's ``step_wait`` to the probe's ``env`` phase."""

    def __init__(self, venv: Any, probe: Probe) -> None:
        super().__init__(venv)
        self.probe = probe

    def reset(self) -> Any:
        return self.venv.reset()

    def step_wait(self) -> Any:
        with self.probe.phase("env"):
            return self.venv.step_wait()


def _timed(probe: Probe, phase: str, fn: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        with probe.phase(phase):
            return fn(*args, **kwargs)
    return call


FACTORY = "harness.specs.peers.sb3:make_trainer"
"""The peer's factory, on the public contract of ``rlgauge run --trainer`` (``harness.specs.own_trainer``):
it takes plain settings and uses nothing a user's own trainer could not."""


def peer_settings(config: TrainConfig) -> dict[str, Any]:
    """What ``make_trainer`` takes, as plain data: the env, the process settings of the config SB3
    is matched from, and SB3's arguments from the matching table."""
    return {
        "algo": config.algo, "env_id": config.env.id, "num_envs": config.env.num_envs,
        "env_kwargs": dict(config.env.kwargs or {}), "activation": config.model.activation,
        "torch_threads": config.optimizations.torch_threads, "return_window": config.run.return_window,
        "anneal_lr": config.ppo.anneal_lr if config.algo == "ppo" else False,
        "learning_rate": config.ppo.learning_rate if config.algo == "ppo" else config.dqn.learning_rate,
        "log_interval": config.dqn.log_interval if config.algo == "dqn" else None,
        "sb3": {m.sb3: _plain(m.sb3_value) for m in matching(config)},
    }


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _tuple(value: Any) -> Any:
    """SB3 reads ``train_freq`` as ``(n, "step")``: a tuple again after the trip through plain data."""
    return tuple(value) if isinstance(value, list) else value


class SB3Trainer:
    """An SB3 PPO or DQN model behind the public trainer contract (``iterate()``, ``close()``, ...)."""

    def __init__(self, settings: dict[str, Any], device: str, seed: int, probe: Probe | None = None) -> None:
        self.settings = s = settings
        self.algo = s["algo"]
        self.probe: Probe = probe or NullProbe()
        if s["torch_threads"]:
            torch.set_num_threads(int(s["torch_threads"]))  # else the default the harness set (fair threads)
        args = s["sb3"]
        env = _TimedVecEnv(make_vec_env(s["env_id"], n_envs=s["num_envs"], seed=seed, env_kwargs=s["env_kwargs"] or None),
                           self.probe)
        policy_kwargs: dict[str, Any] = {"net_arch": args["policy_kwargs.net_arch"],
                                         "activation_fn": ACTIVATIONS[s["activation"]],
                                         "optimizer_kwargs": {"eps": args["policy_kwargs.optimizer_kwargs.eps"]}}
        common = {"seed": seed, "device": device, "verbose": 0}
        if self.algo == "ppo":
            lr = s["learning_rate"]
            schedule = (lambda progress: lr * max(progress, 0.0)) if s["anneal_lr"] else lr
            policy_kwargs["ortho_init"] = args["policy_kwargs.ortho_init"]
            self.model = PPO("MlpPolicy", env, learning_rate=schedule, n_steps=args["n_steps"],
                             batch_size=args["batch_size"], n_epochs=args["n_epochs"], gamma=args["gamma"],
                             gae_lambda=args["gae_lambda"], clip_range=args["clip_range"],
                             clip_range_vf=args["clip_range_vf"], normalize_advantage=args["normalize_advantage"],
                             ent_coef=args["ent_coef"], vf_coef=args["vf_coef"], max_grad_norm=args["max_grad_norm"],
                             policy_kwargs=policy_kwargs, **common)
            self.total_timesteps = args["total_timesteps"]
            self.model.policy.forward = _timed(self.probe, "inference", self.model.policy.forward)
        else:
            self.model = DQN("MlpPolicy", env, learning_rate=args["learning_rate"], buffer_size=args["buffer_size"],
                             learning_starts=args["learning_starts"], batch_size=args["batch_size"], tau=args["tau"],
                             gamma=args["gamma"], train_freq=_tuple(args["train_freq"]), gradient_steps=args["gradient_steps"],
                             target_update_interval=args["target_update_interval"],
                             exploration_fraction=args["exploration_fraction"],
                             exploration_initial_eps=args["exploration_initial_eps"],
                             exploration_final_eps=args["exploration_final_eps"], max_grad_norm=args["max_grad_norm"],
                             policy_kwargs=policy_kwargs, **common)
            self.total_timesteps = FAR_FUTURE
            self.model.predict = _timed(self.probe, "inference", self.model.predict)
        self.model.train = _timed(self.probe, "update", self.model.train)
        # a logger that writes nowhere: SB3's default one makes a folder in the temp directory per model
        self.model.set_logger(Logger(folder=None, output_formats=[]))
        _, self.callback = self.model._setup_learn(self.total_timesteps, None, True, "rlgauge", False)
        self.callback.on_training_start(locals(), globals())
        self.num_envs = s["num_envs"]

    def iterate(self) -> IterationResult:
        """One PPO rollout and its update, or ``log_interval`` DQN agent steps with their training."""
        before, updates = self.model.num_timesteps, 0
        if self.algo == "ppo":
            m = self.model
            m.collect_rollouts(m.env, self.callback, m.rollout_buffer, n_rollout_steps=m.n_steps)
            m._update_current_progress_remaining(m.num_timesteps, self.total_timesteps)
            m.train()
            updates = m.n_epochs * math.ceil(m.n_steps * self.num_envs / m.batch_size)
        else:
            updates = self._dqn_iteration()
        frames = self.model.num_timesteps - before
        return IterationResult(frames, frames, updates)

    def _dqn_iteration(self) -> int:
        """Collect and train as ``OffPolicyAlgorithm.learn`` does, for ``log_interval`` agent steps."""
        m, updates, start = self.model, 0, self.model.num_timesteps
        while m.num_timesteps - start < self.settings["log_interval"]:
            m.collect_rollouts(m.env, train_freq=m.train_freq, action_noise=m.action_noise, callback=self.callback,
                               learning_starts=m.learning_starts, replay_buffer=m.replay_buffer, log_interval=None)
            if m.num_timesteps > 0 and m.num_timesteps > m.learning_starts and m.gradient_steps > 0:
                m.train(batch_size=m.batch_size, gradient_steps=m.gradient_steps)
                updates += m.gradient_steps
        return updates

    def mean_recent_return(self) -> float | None:
        episodes = list(self.model.ep_info_buffer or [])[-self.settings["return_window"]:]
        return float(np.mean([e["r"] for e in episodes])) if episodes else None

    def close(self) -> None:
        self.model.env.close()


def make_trainer(config: dict[str, Any], *, device: str, seed: int, probe: Probe | None = None) -> SB3Trainer:
    """The SB3 peer's factory (``FACTORY``): ``config`` is ``peer_settings(...)``."""
    return SB3Trainer(config, device, seed, probe)
