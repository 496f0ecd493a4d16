"""``rlgauge diagnose`` on any trainer: phase hooks, host syncs and float64 with their lines, rules."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from harness.cli import main
from harness.diagnosis.hooks import hooks
from harness.diagnosis.phases import LoopCounters, PhaseClock

TESTS = Path(__file__).parent
PLANTED_YAML = """\
trainer: planted_trainer:make_trainer
config: {num_envs: 4, num_steps: 8}
variants:
  baseline: {float64_rewards: true, item_per_env: true, per_env_forward: true}
  optimized: {}
run: {steps: 96, warmup_steps: 32, repeats: 1}
"""


@pytest.fixture()
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(TESTS))
    path = tmp_path / "planted.yaml"
    path.write_text(PLANTED_YAML)
    return path


def _diagnose(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["diagnose", *argv, "--json", "--no-compile-check", "--device", "cpu"])  # the planted trainer is CPU-only
    out = capsys.readouterr().out
    return code, json.loads(out)["diagnosis"] if out.strip() else {}


def test_planted_problems_are_found_at_their_lines_with_their_recommendations(
        planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planted_trainer import planted_line

    code, d = _diagnose(capsys, "--trainer", "planted_trainer:make_trainer", "--config", str(planted),
                        "--variant", "baseline")
    assert code == 0
    item_line = planted_line("self.total_reward += reward_t[i].item()")
    items = [s for s in d["host_syncs"] if s["kind"] == ".item()" and s["where"].endswith(f"planted_trainer.py:{item_line}")]
    assert len(items) == 1 and items[0]["per_env_step"] == pytest.approx(1.0)
    float64_line = planted_line("reward_t = torch.tensor(reward)  # float64")
    assert d["float64"][0]["where"].endswith(f"planted_trainer.py:{float64_line}")
    assert d["float64"][0]["op"] == "lift_fresh"
    assert d["forwards_per_env_step"] == pytest.approx(1.0)
    forward_line = planted_line("logits = torch.cat([self.policy(obs[i:i + 1])")
    assert d["inference_forward_sites"][0].endswith(f"planted_trainer.py:{forward_line}")
    rules = {r["rule"] for r in d["recommendations"]}
    per_env = next(r for r in d["recommendations"] if r["rule"] == "per_env_inference")
    assert f"planted_trainer.py:{forward_line}" in per_env["evidence"]
    assert {"per_env_inference", "item_per_step", "float64"} <= rules
    for rec in d["recommendations"]:
        assert rec["change"] and rec["why"] and rec["evidence"] and rec["check"] and rec["effect"]


def test_a_clean_trainer_gets_none_of_the_planted_findings(planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, d = _diagnose(capsys, "--trainer", "planted_trainer:make_trainer", "--config", str(planted),
                        "--variant", "optimized")
    assert code == 0
    assert d["float64"] == [] and d["forwards_per_env_step"] == pytest.approx(0.25)  # one forward per 4 envs
    assert not [s for s in d["host_syncs"] if s["kind"] == ".item()" and s["per_env_step"] >= 0.25]
    assert not {"per_env_inference", "item_per_step", "float64"} & {r["rule"] for r in d["recommendations"]}


def test_a_trainer_file_is_diagnosed_through_the_same_path(planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, d = _diagnose(capsys, str(planted), "--variant", "baseline")
    assert code == 0 and d["kind"] == "trainer" and d["float64"]


@pytest.mark.slow
@pytest.mark.serial  # shares of one run, but a neighbour's load stretches some phases more than others
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
@pytest.mark.parametrize("preset", ["ppo-cartpole", "dqn-cartpole"])
def test_hook_split_agrees_with_the_probe_within_10_points(
        preset: str, variant: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Torch-module acting and NumPy acting, a list replay gathered on the host and a tensor replay. The hook split
    and the probe's come from two passes a few seconds apart: a neighbour's load that came and went between them
    moves one and not the other, so a second diagnosis is taken before a disagreement counts."""
    gaps: list[dict[str, float]] = []
    for _ in range(2):
        code, d = _diagnose(capsys, preset, "--variant", variant, "--steps", "4096")
        assert code == 0
        probe = dict(d["probe_phases"])
        probe["other"] += probe.pop("logging")
        gaps.append({name: abs(d["phases"][name] - probe[name]) for name in probe})
        if max(gaps[-1].values()) <= 10.0:
            break
    assert min(gaps, key=lambda gap: max(gap.values())) == pytest.approx(dict.fromkeys(gaps[0], 0.0), abs=10.0)


class _InstantEnv(gym.Env):
    """Steps in no time: the loop around it is what the clock sees."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        return np.zeros(2, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(2, np.float32), 0.0, False, False, {}


def test_numpy_acting_is_inference_and_storing_the_step_for_torch_is_transfer() -> None:
    """No torch module acts: each step's unhooked work up to its tensor made from NumPy data is transfer,
    the rest (choosing the next action) is inference. Sleeps never end early, so only lower bounds."""
    clock, counters, env = PhaseClock(), LoopCounters(), _InstantEnv()
    with hooks(clock, counters):
        clock.enabled = True
        clock.start_window()
        for _ in range(10):
            obs, *_ = env.step(0)
            time.sleep(0.005)  # the step's data stored on the host ...
            torch.from_numpy(obs)  # ... and handed to torch
            time.sleep(0.010)  # the next action chosen in NumPy
        clock.end_window()
    handed_over, acting = clock.steady_split()
    assert counters.forwards["inference"] == 0
    assert handed_over >= 10 * 0.005 and acting >= 10 * 0.010


def test_a_minibatch_assembled_on_the_host_is_transfer_and_the_rest_of_the_lead_in_update() -> None:
    clock, counters, env = PhaseClock(), LoopCounters(), _InstantEnv()
    net = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with hooks(clock, counters):
        clock.enabled = True
        clock.start_window()
        env.step(0)
        time.sleep(0.02)  # transitions stacked on the host ...
        batch = torch.from_numpy(np.ones((4, 2), np.float32))  # ... and handed to torch
        time.sleep(0.02)  # targets prepared in Python
        net(batch).sum().backward()
        optimizer.step()
        clock.end_window()
    assert clock.seconds["transfer"] >= 0.02 and clock.seconds["update"] >= 0.02


def test_outermost_phase_wins_and_hooks_are_removed_after() -> None:
    clock, counters = PhaseClock(), LoopCounters()
    inner = torch.nn.Linear(2, 2)
    outer = torch.nn.Sequential(inner, torch.nn.Tanh())
    with hooks(clock, counters):
        clock.enabled = True
        with torch.no_grad():
            outer(torch.ones(1, 2))
        _InstantEnv().step(0)
        loss = outer(torch.ones(1, 2)).sum()
        loss.backward()
    assert counters.forwards == {"inference": 1, "update": 1}  # the nested Linear is not counted
    assert clock.seconds["inference"] > 0 and clock.seconds["update"] > 0
    before = dict(clock.seconds)
    outer(torch.ones(1, 2))
    assert clock.seconds == before  # the global hooks are gone
    assert not hasattr(torch.Tensor.backward, "__wrapped__") and not hasattr(torch.autograd.backward, "__wrapped__")


def test_a_trainer_that_raises_is_one_line_with_what_was_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "breaks.py").write_text(
        "import torch\n"
        "class T:\n"
        "    calls = 0\n"
        "    def iterate(self):\n"
        "        self.calls += 1\n"
        "        if self.calls > 3:\n"
        "            raise RuntimeError('simulator lost')\n"
        "        torch.ones(3).sum().item()\n"
        "        return 8\n"
        "    def close(self):\n"
        "        pass\n"
        "def make_trainer(config, *, device, seed):\n"
        "    return T()\n")
    code = main(["diagnose", "--trainer", "breaks:make_trainer", "--steps", "16", "--set", "run.warmup_steps=8",
                 "--no-compile-check"])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.err.strip().splitlines()[-1] == (
        f"rlgauge: your trainer breaks:make_trainer raised during the diagnosis at {tmp_path / 'breaks.py'}:7: "
        "RuntimeError: simulator lost")
    assert captured.err.count("simulator lost") == 1
    assert "phases found by the hooks" in captured.out


@pytest.mark.parametrize("argv, message", [
    (["--trainer", "nowhere_module:make"], "no module named 'nowhere_module'"),
    (["--trainer", "planted_trainer:missing"], "has no attribute 'missing'"),
])
def test_diagnose_bad_trainer_exits_2_with_one_line(planted: Path, capsys: pytest.CaptureFixture[str],
                                                    argv: list[str], message: str) -> None:
    code = main(["diagnose", *argv, "--no-compile-check"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1



def test_host_syncs_are_counted_by_kind_at_the_users_line() -> None:
    from harness.diagnosis.frames import SiteFinder
    from harness.diagnosis.host_syncs import BRANCH, DATA_SHAPE, HOST_COPY, ITEM, HostSyncFinder

    t = torch.arange(4.0)
    finder = HostSyncFinder(torch.device("cpu"), SiteFinder())
    with finder:
        t.sum().item()
        t.numpy()
        if t.sum() > 0:
            t[t > 1].nonzero()
    kinds = {kind for kind, where, _ in finder.sites if where.startswith(__file__ + ":")}
    assert kinds == {ITEM, HOST_COPY, BRANCH, DATA_SHAPE}
    assert t.cpu() is t and not [k for k, _, _ in finder.sites if k == '.to("cpu")']  # free on the CPU: not counted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA's sync debug mode needs a CUDA device")
def test_cuda_sync_debug_mode_reports_syncs_at_the_users_line() -> None:
    from collections import Counter

    from harness.diagnosis.frames import SiteFinder
    from harness.diagnosis.host_syncs import CUDA_SYNC, cuda_sync_warnings

    sites: Counter = Counter()
    before = torch.cuda.get_sync_debug_mode()
    with cuda_sync_warnings(torch.device("cuda"), SiteFinder(), sites):
        torch.ones(3, device="cuda").sum().item()
    assert [where for kind, where, _ in sites if kind == CUDA_SYNC][0].startswith(__file__ + ":")
    assert torch.cuda.get_sync_debug_mode() == before


def test_a_recommendations_effect_is_the_reference_trainers_figure_read_from_the_data_file(
        planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The figures come from the packaged data file ablate writes (never a docs page), labelled as the reference
    trainers'; a rule without a flag says there is no figure."""
    from harness.diagnosis import recommendations

    code, d = _diagnose(capsys, str(planted), "--variant", "baseline")
    assert code == 0
    effects = {r["rule"]: r["effect"] for r in d["recommendations"]}
    assert effects["float64"].startswith("no speed figure")
    from harness.diagnosis.reference_effects import matching, quotable, read_effects

    quoted = quotable(matching("batch_inference", "cpu", read_effects()))
    assert effects["per_env_inference"].startswith("reference trainers' figure" if quoted else  # only a trustworthy one
                                                   "no reference figure: rlgauge's measurement of batch_inference")
    assert "docs/analysis.md" not in " ".join(effects.values())
    assert not hasattr(recommendations, "ANALYSIS_DOC")


def _line(text: str) -> int:
    """The line of this file holding ``text`` (after this function)."""
    lines = Path(__file__).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line and "_line(" not in line)


def test_a_forwards_role_is_what_follows_it_acting_before_an_env_step_update_before_a_backward() -> None:
    """An acting forward that builds a graph is acting (and a finding at its line); a target network's
    forward under no_grad inside the update is the update's."""
    clock, counters, env = PhaseClock(), LoopCounters(), _InstantEnv()
    q_net, target_net = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(q_net.parameters(), lr=0.1)
    from harness.diagnosis.frames import SiteFinder

    with hooks(clock, counters, SiteFinder()):
        clock.enabled = True
        clock.start_window()
        for _ in range(3):
            q_net(torch.ones(1, 2)).argmax()  # acting forward without no_grad
            env.step(0)
        with torch.no_grad():
            target = target_net(torch.ones(4, 2)).max(dim=1).values  # the update's target forward
        loss = ((q_net(torch.ones(4, 2)).max(dim=1).values - target) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        clock.end_window()
        counters.resolve(None)
    assert counters.forwards == {"inference": 3, "update": 2}
    assert {counters.site_of(chain): n for chain, n in counters.graph_acting.items()} == {
        f"{__file__}:{_line('acting forward without no_grad')}": 3}


def test_a_one_dimensional_input_is_one_row() -> None:
    clock, counters, env = PhaseClock(), LoopCounters(), _InstantEnv()
    net = torch.nn.Linear(4, 2)
    with hooks(clock, counters):
        clock.enabled = True
        with torch.no_grad():
            net(torch.ones(4))
            net(torch.ones(3, 4))
        env.step(0)
    assert counters.forwards["inference"] == 2 and counters.inference_rows == 1 + 3


def test_each_sync_is_attributed_to_its_cause() -> None:
    """The for-loop Adam's step counters, a distribution's argument checks, an action taken env by env, the one
    action copy a step needs, and logging: each its own cause."""
    from harness.diagnosis import host_syncs as hs
    from harness.diagnosis.frames import SiteFinder

    clock, counters, env = PhaseClock(), LoopCounters(), _InstantEnv()
    net = torch.nn.Linear(2, 2)
    adam = torch.optim.Adam(net.parameters(), foreach=False)
    finder = hs.HostSyncFinder(torch.device("cpu"), SiteFinder(), counters)
    with hooks(clock, counters), finder:
        clock.enabled = True
        clock.start_window()
        for _ in range(2):
            with torch.no_grad():
                logits = torch.stack([net(torch.ones(2)) for _ in range(4)])
            torch.distributions.Categorical(logits=logits)
            actions = [int(row.argmax().item()) for row in logits]  # per-env acting
            env.step(actions[0])
            net(torch.ones(1, 2)).sum().backward()
            adam.step()
            logits.mean().item()  # logging
        clock.end_window()
        counters.resolve(None)
    rows = hs.per_env_step(finder.sites, 8, counters.acting_syncs, envs_per_step=4.0)
    here = [r for r in rows if r["where"].startswith(__file__)]
    cause = {r["where"].rsplit(":", 1)[1]: r["cause"] for r in here}
    assert cause[str(_line("adam.step()"))] == hs.OPTIMIZER
    assert cause[str(_line("torch.distributions.Categorical(logits=logits)"))] == hs.DISTRIBUTION_CHECKS
    assert cause[str(_line("# per-env acting"))] == hs.PER_ENV_ACTING
    assert cause[str(_line("# logging"))] == hs.LOGGING
    assert hs.cause_of(hs.HOST_COPY, None, 1.0, 1.0) == hs.ACTION_COPY  # one copy per vector step: the minimum


def test_a_per_env_acting_loop_gets_batched_acting_advice_at_its_lines(
        planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planted_trainer import planted_line

    planted.write_text(PLANTED_YAML.replace("optimized: {}", "optimized: {}\n  per_env: {per_env_acting: true}"))
    code, d = _diagnose(capsys, str(planted), "--variant", "per_env")
    assert code == 0
    forward = planted_line("logits_i = self.policy(obs[i])")
    item = planted_line("chosen.append(int(torch.argmax(logits_i).item()))")
    assert d["rows_per_inference_forward"] == pytest.approx(1.0)  # a 1-D observation is one row
    advice = next(r for r in d["recommendations"] if r["rule"] == "per_env_inference")
    assert f"planted_trainer.py:{forward}" in advice["evidence"] and f"planted_trainer.py:{item}" in advice["evidence"]
    assert "item_per_step" not in {r["rule"] for r in d["recommendations"]}  # the action syncs are not logging


def test_a_generator_that_updates_every_tenth_step_is_diagnosed_over_whole_updates(
        planted: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from planted_trainer import planted_line

    code, d = _diagnose(capsys, "--trainer", "planted_trainer:make_dqn_like", "--steps", "200",
                        "--set", "run.warmup_steps=60")
    assert code == 0
    loop = d["loop"]
    assert loop["calls_per_block"] == 10 and loop["optimizer_steps_per_env_step"] == pytest.approx(0.1)
    assert loop["update_forwards_per_env_step"] == pytest.approx(0.2)  # the q forward and the target's
    assert d["forwards_per_env_step"] == pytest.approx(1.0) and not d["warnings"]
    rules = {r["rule"]: r for r in d["recommendations"]}
    acting = planted_line("q_values = q_network(torch.tensor(obs, dtype=torch.float32))")
    assert f"planted_trainer.py:{acting}" in rules["acting_builds_graph"]["evidence"]
    assert not {"host_copies", "per_env_inference"} & set(rules)  # one env: one copy per step is the minimum
    assert "forloop_optimizer" in rules and "step counters" in rules["forloop_optimizer"]["evidence"]


def test_a_cuda_sync_warning_inside_a_counted_call_is_not_counted_twice() -> None:
    """On CUDA, ``bool(t)`` is counted by the host-sync finder and also warned by torch's sync debug mode: one sync.
    A warning raised inside a copy to the device is a blocking copy, with its own cause."""
    from harness.diagnosis import host_syncs
    from harness.diagnosis.frames import SiteFinder

    syncs = host_syncs.HostSyncFinder(torch.device("cpu"), SiteFinder())
    syncs._inside, syncs.current, syncs.current_counted = 1, torch.Tensor.__bool__, True
    assert host_syncs.sync_warning_kind(syncs) is None
    syncs.current, syncs.current_counted = torch.Tensor.to, False
    assert host_syncs.sync_warning_kind(syncs) == host_syncs.TO_DEVICE
    assert host_syncs.cause_of(host_syncs.TO_DEVICE, None, 0.0, 1.0) == host_syncs.BLOCKING_TRANSFER
    syncs._inside = 0
    assert host_syncs.sync_warning_kind(syncs) == host_syncs.CUDA_SYNC
    assert host_syncs.sync_warning_kind(None) == host_syncs.CUDA_SYNC


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_branch_on_a_tensor_is_one_sync_and_a_pageable_copy_is_a_blocking_transfer() -> None:
    from collections import Counter

    from harness.diagnosis import host_syncs
    from harness.diagnosis.frames import SiteFinder

    finder = SiteFinder(own_code_is_rlgauge=False)
    syncs = host_syncs.HostSyncFinder(torch.device("cuda"), finder)
    x = torch.ones(3, device="cuda")
    torch.cuda.synchronize()
    with host_syncs.cuda_sync_warnings(torch.device("cuda"), finder, syncs.sites, syncs):
        with syncs:
            bool((x.sum() > 0))
            torch.tensor([1.0, 2.0]).to("cuda")
    kinds = Counter(kind for kind, _, _ in syncs.sites.elements())
    assert kinds[host_syncs.BRANCH] == 1 and kinds[host_syncs.CUDA_SYNC] == 0
    assert kinds[host_syncs.TO_DEVICE] <= 1
