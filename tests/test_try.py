"""``rlgauge try``: changes applied to a user's trainer without editing it, measured in fresh processes, their maths
checked (docs/try.md).

The end-to-end tests run the planted trainer (a copy, under a module name of its own) with tiny runs; the
session's logic (verdicts, the combination, Ctrl-C) is checked with a fake arm runner in test_try_session.py.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

from harness.cli.app import main
from harness.trials import source_edits
from harness.trials.catalogue import NAMES
from harness.trials.patch_file import combined_files, unified_diff
from harness.trials.runtime_patches import AutocastForwards

TESTS = Path(__file__).resolve().parent
PLANTED_YAML = """\
trainer: try_planted:make_trainer
config: {num_envs: 4, num_steps: 8}
variants:
  baseline: {float64_rewards: true}
run: {steps: 64, warmup_steps: 32, repeats: 2}
"""
TINY_YAML = """\
trainer: try_tiny:make_trainer
config: {rows: 16, fail_without_checks: true}
run: {steps: 64, warmup_steps: 32, repeats: 2}
"""
FAST = ["--device", "cpu", "--steps", "64", "--json"]


def _try(*argv: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["try", *argv])
    text = out.getvalue()
    return code, json.loads(text)["try"] if text.strip() else {}


def _trial(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in data["trials"] if t["change"] == name)


def _line(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.fixture(scope="module", autouse=True)
def _one_thread_in_the_arms():  # noqa: ANN202 - a fixture
    """The arms' processes inherit one intra-op thread: two threads a process on a 2-core machine that other tests
    keep busy make slices swing by 2x (docs/try.md), and these tests check the mechanics, not a thread count."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """One try of three changes on the planted trainer's float64 variant (a copy named try_planted); 2 rounds of one
    turn (2 pairs) give no verdict, so no combination is measured."""
    folder = tmp_path_factory.mktemp("try-planted")
    module = folder / "try_planted.py"
    shutil.copy(TESTS / "planted_trainer.py", module)
    (folder / "planted.yaml").write_text(PLANTED_YAML)
    before = module.read_bytes()
    code, data = _try(str(folder / "planted.yaml"), *FAST, "--rounds", "2", "--repeats", "1",
                      "--only", "float32_at_source,no_validate_args,autocast_bf16", "--patch", str(folder / "out.diff"))
    return SimpleNamespace(code=code, data=data, folder=folder, module=module, before=before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201 - a fixture
    """One try on the tiny trainer (a copy named try_tiny) that raises when distribution checks are off: the A/A
    change, the runtime change that makes it raise, and the source change that does not."""
    folder = tmp_path_factory.mktemp("try-tiny")
    shutil.copy(TESTS / "try_trainer.py", folder / "try_tiny.py")
    (folder / "tiny.yaml").write_text(TINY_YAML)
    code, data = _try(str(folder / "tiny.yaml"), *FAST, "--rounds", "3", "--repeats", "2",
                      "--only", "no_validate_args,validate_args_off")  # and the A/A arm, in every try
    yield SimpleNamespace(code=code, data=data, folder=folder)
    if data.get("workdir"):
        shutil.rmtree(data["workdir"], ignore_errors=True)


def test_a_change_equal_to_the_unchanged_trainer_reports_no_effect_and_identical_maths(tiny: SimpleNamespace) -> None:
    same = _trial(tiny.data, "no_change")
    assert same["parity"]["class"] == "identical" and same["parity"]["max_rel_diff"] == 0.0
    assert same["ratio"]["pairs"] == 6 and same["ratio"]["rounds"] == 3
    assert same["ratio"]["low"] <= same["ratio"]["median"] <= same["ratio"]["high"]
    verdict = same["verdict"]
    if verdict in ("faster", "slower"):  # a 95 % interval misses 1 in 20 A/A tries: confirmed by a second one
        _, again = _try(str(tiny.folder / "tiny.yaml"), *FAST, "--rounds", "3", "--repeats", "2", "--only",
                        "no_change")
        verdict = _trial(again, "no_change")["verdict"]
    assert verdict.startswith("no effect it could resolve at ±"), verdict


def test_a_trial_whose_trainer_raises_fails_alone(tiny: SimpleNamespace) -> None:
    assert tiny.code == 1
    failed = _trial(tiny.data, "no_validate_args")
    assert failed["verdict"] == "failed: RuntimeError: planted failure: distribution checks are off"
    assert failed["ratio"] is None
    workdir = Path(tiny.data["workdir"])  # kept, so that the log the failure names is there to read
    assert Path(failed["log"]).parent == workdir and "planted failure" in Path(failed["log"]).read_text()
    kept = _trial(tiny.data, "validate_args_off")
    assert kept["error"] is None and kept["ratio"]["pairs"] == 6 and kept["parity"]["class"] == "identical"
    assert "validate_args=False" in kept["diff"]


def test_float32_at_source_edits_the_line_found_and_removes_the_float64_ops(planted: SimpleNamespace) -> None:
    trial = _trial(planted.data, "float32_at_source")
    line = _line(planted.module, "reward_t = torch.tensor(reward)  # float64")
    assert trial["kind"] == "source" and trial["where"] == [f"{planted.module}:{line}"]
    assert f"@@ -{line - 3},7 +{line - 3},7 @@" in trial["diff"]
    assert "+                reward_t = torch.tensor(reward, dtype=torch.float32)  # float64" in trial["diff"]
    assert trial["diff"].startswith("--- a/try_planted.py\n+++ b/try_planted.py\n")
    assert trial["float64_ops"]["unchanged"] > 0 and trial["float64_ops"]["changed"] == 0
    assert trial["parity"]["class"] == "identical"  # CartPole's rewards are 1.0 in float32 as in float64


def test_no_validate_args_removes_the_distribution_checks_syncs(planted: SimpleNamespace) -> None:
    trial = _trial(planted.data, "no_validate_args")
    syncs = trial["host_syncs_per_step"]
    assert syncs["changed"] <= syncs["unchanged"] - 1.0  # the acting Categorical's check: one per vector step
    assert trial["parity"]["class"] == "identical"


def test_autocast_on_cpu_changes_the_maths_and_stays_out_of_the_combination(planted: SimpleNamespace) -> None:
    assert planted.code == 0, planted.data
    trial = _trial(planted.data, "autocast_bf16")
    assert trial["parity"]["class"] == "changes the maths" and trial["parity"]["max_rel_diff"] > 1e-4
    assert trial["verdict"] == "no verdict: 2 rounds (needs 3)"
    assert planted.data["combined"]["changes"] == []  # (with verdicts: test_the_combination_takes_...)


AUTOCAST_YAML = """\
trainer: try_autocast:make_trainer
config: {rows: 16}
run: {steps: 64, warmup_steps: 32, repeats: 2}
"""


def test_autocast_runs_on_a_trainer_that_copies_acting_outputs_to_numpy_and_index_adds_float32(
        tmp_path: Path) -> None:
    shutil.copy(TESTS / "try_autocast_trainer.py", tmp_path / "try_autocast.py")
    (tmp_path / "autocast.yaml").write_text(AUTOCAST_YAML)
    code, data = _try(str(tmp_path / "autocast.yaml"), *FAST, "--rounds", "2", "--repeats", "1",
                      "--only", "autocast_bf16")
    trial = _trial(data, "autocast_bf16")
    assert code == 0 and trial["error"] is None, trial  # whole-iterate autocast raised in .numpy() and index_add_
    assert trial["ratio"]["pairs"] == 2 and trial["parity"]["class"] == "changes the maths"
    assert data["combined"]["changes"] == []


class _Policy(nn.Module):
    """SB3's shape: the update calls its children through a method, never ``forward``."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 2)

    def evaluate(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def test_autocast_covers_the_update_forwards_whatever_calls_them_and_their_outputs_leave_as_float32() -> None:
    policy = _Policy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    autocast = AutocastForwards("cpu")
    seen: list[tuple[str, torch.dtype]] = []
    record = register_module_forward_hook(lambda m, a, out: seen.append((type(m).__name__, out.dtype)))
    try:
        x = torch.ones(3, 4)
        with torch.no_grad():
            assert policy.evaluate(x).dtype == torch.float32 and {d for _, d in seen} == {torch.float32}  # acting
        seen.clear()
        out = policy.evaluate(x)  # the update
        assert out.dtype == torch.float32 and ("Linear", torch.bfloat16) in seen
        out.sum().backward()
        optimizer.step()
        autocast.iteration_done()  # stepped: the finding hooks go, the modules found keep theirs
        target = copy.deepcopy(policy)  # a target network copied now keeps them, with its own weights
        seen.clear()
        assert target.evaluate(x).dtype == torch.float32 and seen[0] == ("Linear", torch.bfloat16)
        assert not torch.is_autocast_enabled("cpu")
    finally:
        record.remove()
        autocast.close()


def test_the_users_files_are_left_as_they_were(planted: SimpleNamespace) -> None:
    assert planted.module.read_bytes() == planted.before
    assert {p.name for p in planted.folder.iterdir()} - {"__pycache__"} == {"try_planted.py", "planted.yaml"}


def test_an_unknown_change_name_exits_2_listing_the_accepted_names(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_YAML)
    assert main(["try", str(tmp_path / "tiny.yaml"), "--only", "no_change,fast_please"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'fast_please'" in err and ", ".join(NAMES) in err


def test_an_existing_patch_file_is_refused_without_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_YAML)
    (tmp_path / "out.diff").write_text("mine\n")
    assert main(["try", str(tmp_path / "tiny.yaml"), "--patch", str(tmp_path / "out.diff")]) == 2
    assert "--force" in capsys.readouterr().err and (tmp_path / "out.diff").read_text() == "mine\n"


# --------------------------------------------------------------------------- source edits, on text

def test_float32_edits_the_one_call_that_makes_an_array_from_data() -> None:
    text = "import numpy as np\nimport torch as th\nr = th.tensor(reward).view(-1)\nx = np.asarray(obs)\n" \
           "y = th.from_numpy(z)\nw = th.tensor(a, dtype=th.float64)\n"
    assert "r = th.tensor(reward, dtype=th.float32).view(-1)\n" in source_edits.float32_at_source(text, 3)
    assert "x = np.asarray(obs).astype(np.float32)\n" in source_edits.float32_at_source(text, 4)
    assert "y = th.from_numpy(z).float()\n" in source_edits.float32_at_source(text, 5)
    with pytest.raises(source_edits.EditRefused, match="no call that makes a tensor"):
        source_edits.float32_at_source(text, 6)  # an explicit dtype is the user's choice
    with pytest.raises(source_edits.EditRefused, match="2 calls"):
        source_edits.float32_at_source("import torch\na = torch.tensor(x) + torch.tensor(y)\n", 2)


def test_validate_args_is_added_to_each_distribution_built_on_the_line() -> None:
    text = ("from torch.distributions.categorical import Categorical\nimport torch\n"
            "d = Categorical(logits=l); n = torch.distributions.Normal(m, s,)\nd.log_prob(a)\n")
    edited = source_edits.validate_args_off(text, 3)
    assert "Categorical(logits=l, validate_args=False)" in edited
    assert "torch.distributions.Normal(m, s, validate_args=False,)" in edited
    with pytest.raises(source_edits.EditRefused, match="builds no torch.distributions"):
        source_edits.validate_args_off(text, 4)


def test_no_grad_wraps_a_lone_assignment_and_refuses_anything_else() -> None:
    text = "import torch\nfor o in obs:\n    q = net(o)  # acting\n    if o: p = net(o)\n"
    assert "    with torch.no_grad():\n        q = net(o)  # acting\n" in source_edits.no_grad_acting(text, 3)
    with pytest.raises(source_edits.EditRefused, match="line 4 is not a single assignment"):
        source_edits.no_grad_acting(text, 4)


def test_the_patch_applies_with_patch_p1_and_adds_the_runtime_lines(tmp_path: Path) -> None:
    original = (TESTS / "try_trainer.py").read_text()
    path = tmp_path / "try_tiny.py"
    path.write_text(original)
    line = _line(path, "dist = torch.distributions.Categorical(")
    edited = {path: (original, source_edits.validate_args_off(original, line))}
    files = combined_files(["validate_args_off", "threads_1", "fused_optimizer"], edited, path, "make_trainer",
                           {"Adam": "fused"})
    diff = unified_diff(files, tmp_path)
    (tmp_path / "out.diff").write_text(diff)
    subprocess.run(["patch", "-p1", "-i", "out.diff"], cwd=tmp_path, check=True, capture_output=True)
    patched = path.read_text()
    assert patched == files[path][1]
    assert "Categorical(logits=self.policy(obs), validate_args=False)" in patched
    assert "lr=1e-2, fused=True)" in patched
    assert "    torch.set_num_threads(1)  # rlgauge try: threads_1\n    return Tiny(config, seed)" in patched


def test_diagnose_try_hands_its_findings_to_the_trials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``diagnose --try`` runs try's trials on the recommendations it printed; a preset is refused before anything
    runs."""
    import harness.cli.try_command as try_command

    shutil.copy(TESTS / "planted_trainer.py", tmp_path / "try_planted.py")
    (tmp_path / "planted.yaml").write_text(PLANTED_YAML)
    seen: dict[str, Any] = {}

    def trials(args: Any, spec: Any, resolution: Any, label: str, found: dict, only: Any) -> int:
        seen.update(found=found, rounds=args.rounds, only=only)
        return 0

    monkeypatch.setattr(try_command, "try_changes", trials)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["diagnose", str(tmp_path / "planted.yaml"), "--try", "--device", "cpu", "--steps", "64"])
    out = capsys.readouterr().out
    assert code == 0 and "## Trying the changes" in out
    assert "float64" in {r["rule"] for r in seen["found"]["recommendations"]} and seen["only"] is None
    assert main(["diagnose", "ppo-cartpole", "--try"]) == 2
    assert "--try" in capsys.readouterr().err


def test_a_busy_machine_caps_every_arms_default_threads_as_run_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run.fair_threads`` for the arms: decided once where the try runs, applied in each child before its
    factory."""
    from types import SimpleNamespace as NS

    import harness.measurement.machine_state as machine_state
    from harness.trials.processes import child
    from harness.trials.session import fair_threads_cap
    from reference_trainers.runtime import device as dev

    monkeypatch.setattr(dev, "DEFAULT_THREADS", 2)
    monkeypatch.setattr(machine_state.Snapshot, "take", staticmethod(lambda: NS(busy_cores_before=1.0)))
    monkeypatch.setattr(machine_state, "free_cores", lambda busy: 1)
    assert fair_threads_cap(True) == 1
    assert fair_threads_cap(False) is None
    try:
        child._cap_threads({"threads_cap": 1})
        assert dev.default_threads() == 1
    finally:
        dev.cap_default_threads(None)
    assert dev.default_threads() == 2


def test_an_unknown_executor_exits_2_naming_the_accepted_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["try", "x.yaml", "--executor", "slurm"]) == 2
    err = capsys.readouterr().err
    assert "--executor slurm: unknown executor; accepted: local | ray | ray:ADDRESS" in err and "Traceback" not in err


def test_a_try_sent_to_an_executor_runs_as_one_job_and_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--executor ray``: the whole try is one campaign job (its arms must alternate on one host)."""
    from harness.campaigns.jobs import Gathered
    from harness.cli import try_command
    from harness.trials import session as session_module

    seen: dict[str, Any] = {}

    class OneJob:
        name = "ray"

        def run(self, jobs: list, *, cpus_per_job: int, on_result: Any = None) -> Gathered:
            (job,) = jobs
            seen.update(fn=job.fn, args=job.args)
            return Gathered(results={"try": "the report"}, hosts={"try": "node-7"})

    said: list[str] = []
    result = try_command._remote_try(OneJob(), ("target", "x.yaml", "cpu", [], (None, "f"), 3, 3, 8), said.append)
    assert result == "the report" and seen["fn"] is session_module.run_try_job
    assert seen["args"][5:] == (3, 3, 8) and any("node-7" in line for line in said)


def test_try_quiet_sends_the_trainers_prints_while_diagnosed_to_a_named_file(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """``try --quiet``: what the trainer prints while it is diagnosed goes to rlgauge-try.stdout.txt, named on
    stderr; the table or JSON on stdout is rlgauge's alone."""
    from harness.cli import try_command

    (tmp_path / "chatty.py").write_text(
        "import torch\n"
        "class T:\n"
        "    def __init__(self):\n"
        "        self.net = torch.nn.Linear(2, 1)\n"
        "        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)\n"
        "    def iterate(self):\n"
        "        print('SPS: 123')\n"
        "        loss = self.net(torch.ones(4, 2)).sum()\n"
        "        self.opt.zero_grad(); loss.backward(); self.opt.step()\n"
        "        return 4\n"
        "    def close(self):\n"
        "        pass\n"
        "def make_trainer(config, *, device, seed):\n"
        "    return T()\n", encoding="utf-8")
    (tmp_path / "chatty.yaml").write_text("trainer: chatty:make_trainer\nconfig: {}\nrun: {steps: 64, warmup_steps: 8}\n",
                                          encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = {}

    def no_trials(args, spec, resolution, label, found, only):  # noqa: ANN001, ANN202
        seen["found"] = found
        print('{"trials": []}')
        return 0

    monkeypatch.setattr(try_command, "try_changes", no_trials)
    assert main(["try", "chatty.yaml", "--device", "cpu", "--quiet", "--json"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == '{"trials": []}' and "SPS" not in out
    assert "SPS: 123" in (tmp_path / "rlgauge-try.stdout.txt").read_text(encoding="utf-8")
    assert "rlgauge-try.stdout.txt" in err and seen["found"]


def test_autocast_trial_runs_on_a_forward_called_inside_compiled_code() -> None:
    """LeanRL compiles its update: the module hooks that enter and leave autocast run eagerly there (a traced
    ``__enter__`` would be replayed by the graph while the ``__exit__`` ran for real: "'autocast' object has no
    attribute 'prev'"), and the forward still runs in bfloat16 with its output back in float32."""
    from torch import nn

    from harness.trials.runtime_patches import AutocastForwards

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 2))
    x = torch.randn(16, 4)
    plain = net(x).detach()
    casting = AutocastForwards("cpu")
    try:
        @torch.compile(backend="eager")
        def update(batch: torch.Tensor) -> torch.Tensor:
            out = net(batch)
            out.pow(2).mean().backward()
            return out

        outs = [update(x) for _ in range(2)]
    finally:
        casting.close()
    assert all(out.dtype == torch.float32 for out in outs)
    assert not torch.equal(outs[-1].detach(), plain)  # the forward ran in bfloat16
    assert torch.allclose(outs[-1].detach(), plain, atol=0.05)


def test_autocast_inside_a_fullgraph_compile_fails_with_a_line_that_says_so() -> None:
    """LeanRL compiles with fullgraph=True: the autocast hooks' graph break is refused by dynamo; the arm's one line
    says what cannot be done and where, instead of dynamo's message."""
    from torch import nn

    from harness.trials.processes.child import arm_failure
    from harness.trials.runtime_patches import AutocastForwards

    net = nn.Linear(4, 2)
    casting = AutocastForwards("cpu")
    try:
        casting.hook(net)

        @torch.compile(backend="eager", fullgraph=True)
        def update(batch: torch.Tensor) -> torch.Tensor:
            return net(batch).sum()

        with pytest.raises(Exception) as raised:
            update(torch.randn(3, 4))
    finally:
        casting.close()
    line = arm_failure(raised.value, ["autocast_bf16"])
    assert line.startswith("autocast_bf16 cannot run here: a module is called inside code compiled with fullgraph=True")
    assert "test_try.py:" in line and "\n" not in line
    assert arm_failure(ValueError("x"), ["autocast_bf16"]) == "ValueError: x"
