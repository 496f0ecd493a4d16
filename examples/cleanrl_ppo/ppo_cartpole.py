"""CleanRL-style PPO on CartPole-v1: an example of *your own* trainer measured by rlgauge.

rlgauge times any trainer that exposes ``make_trainer(config, *, device, seed, probe=None)``
returning an object with ``iterate() -> env steps``, ``close()``, ``mean_recent_return()``,
``state_dict()`` and ``load_state_dict()``. This file is that contract wrapped around a
single-file PPO written the way CleanRL writes them (see cleanrl/ppo.py), plus a few speed
switches (``vectorization``, ``torch_threads``, ``batched_inference_no_grad``, ``fused_adam``,
``preallocated_storage``, ``validate_args``). Each defaults to the plain CleanRL path and each
switches a real code path, so ``bench.yaml`` can time plain against optimised. The probe, when given, is told when
the trainer is stepping envs, choosing actions, copying data and updating the networks.
"""

from __future__ import annotations

import contextlib
import random
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn, optim
from torch.distributions.categorical import Categorical

DEFAULTS: dict = {
    "env_id": "CartPole-v1", "num_envs": 4, "num_steps": 128, "learning_rate": 2.5e-4, "anneal_lr": True,
    "gamma": 0.99, "gae_lambda": 0.95, "num_minibatches": 4, "update_epochs": 4, "norm_adv": True,
    "clip_coef": 0.2, "clip_vloss": True, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5,
    "total_timesteps": 500_000,
    # speed switches: the defaults are the plain CleanRL path
    "vectorization": "sync", "torch_threads": None, "batched_inference_no_grad": False,
    "fused_adam": False, "preallocated_storage": False, "validate_args": True,
}
_NULL = contextlib.nullcontext()


def parse_config(config: dict | None) -> dict:
    """``DEFAULTS`` overlaid with ``config``; an unknown key or vectorization mode raises ValueError."""
    config = dict(config or {})
    unknown = sorted(set(config) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(map(repr, unknown))}; "
                         f"accepted keys: {', '.join(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    for key, default in DEFAULTS.items():  # YAML may hand over "2.5e-4" style strings or ints for floats
        if isinstance(default, float) or (isinstance(default, int) and not isinstance(default, bool)):
            cfg[key] = type(default)(cfg[key])
    if cfg["vectorization"] not in ("sync", "async"):
        raise ValueError(f"vectorization must be 'sync' or 'async', not {cfg['vectorization']!r}")
    return cfg


def make_env(env_id):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return thunk


SQRT2 = float(np.sqrt(2))


def layer_init(layer, std=SQRT2, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs, validate_args=True):
        super().__init__()
        self.validate_args = validate_args
        obs_dim = int(np.array(envs.single_observation_space.shape).prod())
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits, validate_args=self.validate_args)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)

    def act_fast(self, x):
        """Rollout-only action selection: softmax + multinomial, no distribution object."""
        logits = self.actor(x)
        action = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)
        logprob = torch.log_softmax(logits, dim=-1).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return action, logprob, self.critic(x)


class PPOTrainer:
    """One ``iterate()`` = one rollout of num_steps x num_envs env steps and its PPO update."""

    def __init__(self, cfg: dict, device: str, seed: int, probe=None):
        self.cfg, self.seed, self.device = cfg, int(seed), torch.device(device)
        self._threads = cfg["torch_threads"] if cfg["torch_threads"] is not None else torch.get_num_threads()
        torch.set_num_threads(self._threads)
        self._phase = probe.phase if probe is not None else (lambda _name: _NULL)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

        vec_cls = gym.vector.AsyncVectorEnv if cfg["vectorization"] == "async" else gym.vector.SyncVectorEnv
        # SAME_STEP autoreset: the obs returned with done=True is already the next episode's first
        # obs, the semantics CleanRL's GAE (dones[t + 1] masks the bootstrap) was written for.
        self.envs = vec_cls([make_env(cfg["env_id"]) for _ in range(cfg["num_envs"])],
                            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
        assert isinstance(self.envs.single_action_space, gym.spaces.Discrete), "only discrete actions"

        self.agent = Agent(self.envs, cfg["validate_args"]).to(self.device)
        fused = {"foreach": False, "fused": True} if cfg["fused_adam"] else {}
        self.optimizer = optim.Adam(self.agent.parameters(), lr=cfg["learning_rate"], eps=1e-5, **fused)

        # ALGO Logic: Storage setup (numpy buffers under preallocated_storage, else CleanRL's torch tensors)
        shape = (cfg["num_steps"], cfg["num_envs"])
        obs_shape = shape + self.envs.single_observation_space.shape
        if cfg["preallocated_storage"]:
            self.buffers = {"obs": np.zeros(obs_shape, np.float32), "actions": np.zeros(shape, np.int64),
                            **{k: np.zeros(shape, np.float32) for k in ("logprobs", "rewards", "dones", "values")}}
        else:
            self.buffers = {"obs": torch.zeros(obs_shape), "actions": torch.zeros(shape),
                            **{k: torch.zeros(shape) for k in ("logprobs", "rewards", "dones", "values")}}
            self.buffers = {k: v.to(self.device) for k, v in self.buffers.items()}
        self.batch_size = cfg["num_steps"] * cfg["num_envs"]
        self.num_iterations = max(1, cfg["total_timesteps"] // self.batch_size)
        self.global_step, self.iteration = 0, 0
        self.recent_returns: deque[float] = deque(maxlen=20)
        self._reset_envs(self.seed)

    def _reset_envs(self, seed: int) -> None:
        next_obs, _ = self.envs.reset(seed=seed)
        next_done = np.zeros(self.cfg["num_envs"], np.float32)
        if self.cfg["preallocated_storage"]:
            self.next_obs, self.next_done = next_obs.astype(np.float32), next_done
        else:
            self.next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=self.device)
            self.next_done = torch.as_tensor(next_done, device=self.device)

    def _act(self, x):
        """Action, its log-probability and the value for a batch of observations (no autograd)."""
        if self.cfg["batched_inference_no_grad"]:
            with torch.inference_mode():
                return self.agent.act_fast(x)
        with torch.no_grad():
            action, logprob, _, value = self.agent.get_action_and_value(x)
        return action, logprob, value

    def iterate(self) -> int:
        """One rollout and its PPO update; returns the env steps taken."""
        cfg, phase, device, b = self.cfg, self._phase, self.device, self.buffers
        numpy_storage = cfg["preallocated_storage"]
        torch.set_num_threads(self._threads)  # other trainers in this process may have changed it
        self.iteration += 1
        if cfg["anneal_lr"]:
            frac = max(0.0, 1.0 - (self.iteration - 1.0) / self.num_iterations)
            self.optimizer.param_groups[0]["lr"] = frac * cfg["learning_rate"]

        for step in range(cfg["num_steps"]):
            self.global_step += cfg["num_envs"]
            b["obs"][step] = self.next_obs
            b["dones"][step] = self.next_done
            if numpy_storage:
                with phase("transfer"):
                    x = torch.from_numpy(self.next_obs).to(device)
            else:
                x = self.next_obs

            with phase("inference"):
                action, logprob, value = self._act(x)
                action_np = action.cpu().numpy()
                if numpy_storage:
                    b["actions"][step] = action_np
                    b["logprobs"][step] = logprob.cpu().numpy()
                    b["values"][step] = value.view(-1).cpu().numpy()
                else:
                    b["actions"][step] = action
                    b["logprobs"][step] = logprob
                    b["values"][step] = value.flatten()

            with phase("env"):
                next_obs, reward, terminations, truncations, infos = self.envs.step(action_np)
            next_done = np.logical_or(terminations, truncations)
            if numpy_storage:
                b["rewards"][step] = reward
                self.next_obs, self.next_done = next_obs.astype(np.float32, copy=False), next_done.astype(np.float32)
            else:
                with phase("transfer"):
                    # cast on the NumPy side: gymnasium's float64 rewards never become a float64 tensor
                    b["rewards"][step] = torch.as_tensor(reward.astype(np.float32), device=device)
                    self.next_obs = torch.as_tensor(next_obs.astype(np.float32, copy=False), device=device)
                    self.next_done = torch.as_tensor(next_done.astype(np.float32), device=device)

            if "_final_info" in infos:
                with phase("logging"):
                    final = infos["final_info"]
                    if "_episode" in final:
                        self.recent_returns.extend(float(r) for r in final["episode"]["r"][final["_episode"]])

        if numpy_storage:
            with phase("transfer"):  # one host->device conversion per buffer per rollout
                data = {k: torch.from_numpy(v).to(device) for k, v in b.items()}
                next_obs_t, next_done_t = (torch.from_numpy(a).to(device) for a in (self.next_obs, self.next_done))
        else:
            data, next_obs_t, next_done_t = b, self.next_obs, self.next_done
        with phase("update"):
            self._update(data, next_obs_t, next_done_t)
        return self.batch_size

    def _update(self, data: dict, next_obs, next_done) -> None:
        """GAE over the rollout, then update_epochs x num_minibatches clipped-PPO steps (CleanRL)."""
        cfg, agent = self.cfg, self.agent
        obs, actions, logprobs = data["obs"], data["actions"], data["logprobs"]
        rewards, dones, values = data["rewards"], data["dones"], data["values"]
        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages = torch.zeros_like(rewards)
            lastgaelam = 0
            for t in reversed(range(cfg["num_steps"])):
                if t == cfg["num_steps"] - 1:
                    nextnonterminal = 1.0 - next_done
                    nextvalues = next_value
                else:
                    nextnonterminal = 1.0 - dones[t + 1]
                    nextvalues = values[t + 1]
                delta = rewards[t] + cfg["gamma"] * nextvalues * nextnonterminal - values[t]
                advantages[t] = lastgaelam = delta + cfg["gamma"] * cfg["gae_lambda"] * nextnonterminal * lastgaelam
            returns = advantages + values

        # flatten the batch
        b_obs = obs.reshape((-1,) + self.envs.single_observation_space.shape)
        b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape(-1).long()
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), values.reshape(-1)

        # Optimizing the policy and value network
        minibatch_size = self.batch_size // cfg["num_minibatches"]
        b_inds = np.arange(self.batch_size)
        for _epoch in range(cfg["update_epochs"]):
            np.random.shuffle(b_inds)
            for start in range(0, self.batch_size, minibatch_size):
                mb_inds = b_inds[start:start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                ratio = (newlogprob - b_logprobs[mb_inds]).exp()

                mb_advantages = b_advantages[mb_inds]
                if cfg["norm_adv"]:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - cfg["clip_coef"], 1 + cfg["clip_coef"])
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if cfg["clip_vloss"]:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -cfg["clip_coef"], cfg["clip_coef"])
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                loss = pg_loss - cfg["ent_coef"] * entropy.mean() + v_loss * cfg["vf_coef"]
                self.optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), cfg["max_grad_norm"])
                self.optimizer.step()

    def mean_recent_return(self) -> float | None:
        """Mean return of the last 20 finished episodes (None before the first one ends)."""
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def state_dict(self) -> dict:
        """Networks, optimiser, counters and RNG states: tensors and plain Python values only."""
        np_state = np.random.get_state()
        state = {
            "agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(),
            "global_step": self.global_step, "iteration": self.iteration, "seed": self.seed,
            "recent_returns": list(self.recent_returns),
            "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "numpy_rng": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                          "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restores ``state_dict()``; the envs restart from a reset seeded by the saved step."""
        self.agent.load_state_dict(state["agent"])
        fused, foreach = (True, False) if self.cfg["fused_adam"] else (None, None)  # keep this trainer's switch
        groups = [{**g, "fused": fused, "foreach": foreach} for g in state["optimizer"]["param_groups"]]
        self.optimizer.load_state_dict({**state["optimizer"], "param_groups": groups})
        self.global_step, self.iteration = int(state["global_step"]), int(state["iteration"])
        self.seed = int(state["seed"])
        self.recent_returns = deque(state["recent_returns"], maxlen=20)
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        random.setstate(state["python_rng"])
        n = state["numpy_rng"]
        np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                             n["cached_gaussian"]))
        self._reset_envs(self.seed + self.global_step)

    def close(self) -> None:
        self.envs.close()


def make_trainer(config: dict, *, device: str, seed: int, probe=None) -> PPOTrainer:
    """rlgauge's entry point: a PPO trainer for ``config`` (see ``DEFAULTS``) on ``device``."""
    return PPOTrainer(parse_config(config), device=device, seed=seed, probe=probe)
