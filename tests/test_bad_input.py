"""Bad input, tried systematically against every subcommand.

Each case gives exit code 2, exactly one line on stderr (``rlgauge: error: ...`` naming the
problem), nothing on stdout, no traceback, and leaves every file that existed untouched.
A hypothesis test then feeds random YAML documents and ``--set`` strings to ``rlgauge config``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import COMMANDS, main
from harness.report.runs_md import new_file_text
from results_factory import make_result, write_results

PRESET = "ppo-cartpole"



# --------------------------------------------------------------------------- the workspace each case runs in

class Workspace:
    """A folder with a good result file, a valid RUNS.md, an earlier ``out.json`` and writers of bad files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.good = write_results(root / "good.json", make_result("baseline"), make_result("optimized"))
        self.runs_md = root / "RUNS.md"
        self.runs_md.write_text(new_file_text(), encoding="utf-8")
        self.out = root / "out.json"
        self.out.write_text("an earlier result\n", encoding="utf-8")

    def text(self, name: str, content: str | bytes) -> str:
        path = self.root / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return str(path)

    def result(self, name: str, edit: Callable[[dict[str, Any]], Any]) -> str:
        """The good result file, edited (``edit`` changes the payload in place or returns a new one)."""
        payload = json.loads(self.good.read_text(encoding="utf-8"))
        payload = edit(payload) or payload
        return self.text(name, json.dumps(payload))

    def run(self, *argv: str) -> list[str]:
        """``run`` with a tiny budget and ``--out`` pointing at the earlier result (which must survive)."""
        return ["run", *argv, "--set", "device=cpu", "--steps", "64", "--out", str(self.out)]


def _set(payload: dict[str, Any], run: int, path: str, value: Any) -> None:
    node = payload["runs"][run]
    *parents, last = path.split(".")
    for key in parents:
        node = node[key]
    node[last] = value


def _edit(run: int, path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda payload: _set(payload, run, path, value)


def _delete(run: int, key: str) -> Callable[[dict[str, Any]], None]:
    def delete(payload: dict[str, Any]) -> None:
        del payload["runs"][run][key]
    return delete


LAUGHS = "".join(f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}'] * 9) if i else 'x, x, x, x'}]\n"
                 for i in range(9))
BROKEN_ROW = new_file_text() + "| only | three | cells |\n"
Case = tuple[Callable[[Workspace], list[str]], str]
_REQUIRED_ARGS = lambda w: {"run": [PRESET], "config": [PRESET], "compare": [str(w.good)],  # noqa: E731
                            "record": ["--milestone", "m", str(w.good)], "ablate": [PRESET],
                            "sweep": [PRESET, "--param", "env.num_envs=1,2"], "learn": [PRESET]}

CASES: dict[str, Case] = {
    # ----- malformed YAML, in every place YAML is read
    "run: malformed YAML file": (lambda w: w.run(w.text("c.yaml", "env: {id: CartPole-v1\n  x: [\n")), "malformed YAML"),
    "config: malformed YAML file": (lambda w: ["config", w.text("c.yaml", "a: b: c\n")], "malformed YAML"),
    "gate: malformed YAML preset": (lambda w: ["gate", "--run", w.text("c.yaml", "{{{")], "malformed YAML"),
    "gate: malformed thresholds": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                              "--thresholds", w.text("t.yaml", "a: [\n")], "malformed YAML"),
    "config: YAML not UTF-8": (lambda w: ["config", w.text("c.yaml", b"\xff\xfe\x00env")], "not a UTF-8 text file"),
    "config: YAML list at the top": (lambda w: ["config", w.text("c.yaml", "- 1\n- 2\n")], "expected a mapping"),
    "config: YAML alias containing itself": (lambda w: ["config", w.text("c.yaml", "env: &a {kwargs: *a}\n")],
                                             "alias refers to a collection that contains it"),
    "run: YAML nested 5000 deep": (lambda w: w.run(w.text("c.yaml", "env: " + "[" * 5000 + "]" * 5000)),
                                   "nested deeper than"),
    "config: YAML billion laughs": (lambda w: ["config", w.text("c.yaml", "env:\n  kwargs:\n" + "".join(
        "    " + line + "\n" for line in LAUGHS.splitlines()))], "values once aliases are expanded"),
    "config: YAML python tag is not executed": (lambda w: ["config", w.text(
        "c.yaml", f"seed: !!python/object/apply:os.system ['touch {w.root / 'pwned'}']\n")], "could not determine"),
    "gate: thresholds alias containing itself": (lambda w: ["gate", "--baseline", str(w.good), "--candidate",
                                                            str(w.good), "--thresholds",
                                                            w.text("t.yaml", "throughput_metrics: &a [*a]\n")],
                                                 "alias refers"),
    # ----- wrong types
    "run: --set count is text": (lambda w: w.run(PRESET, "--set", "env.num_envs=abc"), "env.num_envs"),
    "run: --steps is text": (lambda w: w.run(PRESET, "--steps", "abc"), "--steps"),
    "config: YAML learning rate is text": (lambda w: ["config", w.text("c.yaml", "ppo: {learning_rate: fast}\n")],
                                           "ppo.learning_rate"),
    "config: YAML section is a number": (lambda w: ["config", w.text("c.yaml", "env: 3\n")], "env"),
    "config: hidden sizes is text": (lambda w: ["config", PRESET, "--set", "model.hidden_sizes=abc"],
                                     "model.hidden_sizes"),
    "config: a switch given a count": (lambda w: ["config", PRESET, "--set", "optimizations.batch_inference=1"],
                                       "optimizations.batch_inference"),
    "config: --set below a value": (lambda w: ["config", PRESET, "--set", "seed.x=1"], "seed"),
    "config: seed is a date": (lambda w: ["config", w.text("c.yaml", "seed: 2020-01-01\n")], "seed"),
    "gate: --repeats is a fraction": (lambda w: ["gate", "--run", PRESET, "--repeats", "1.5"], "--repeats"),
    "gate: --max-slowdown is text": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                                "--max-slowdown", "ten"], "--max-slowdown"),
    "compare: --confidence is text": (lambda w: ["compare", str(w.good), "--confidence", "high"], "--confidence"),
    "gate: thresholds value is text": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                                  "--thresholds", w.text("t.yaml", "confidence: high\n")], "confidence"),
    # ----- unknown keys and options
    "run: unknown --set key": (lambda w: w.run(PRESET, "--set", "optimizations.warp_drive=true"), "warp_drive"),
    "config: unknown YAML key": (lambda w: ["config", w.text("c.yaml", "sead: 3\n")], "did you mean 'seed'"),
    "config: unknown preset-file key": (lambda w: ["config", w.text("p.yaml", "variants: {baseline: {}}\nextra: 1\n")],
                                        "unknown top-level key 'extra'"),
    "gate: unknown thresholds key": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                                "--thresholds", w.text("t.yaml", "max_slowdown: 5\n")], "unknown key"),
    "presets: an argument it does not take": (lambda w: ["presets", "extra"], "unrecognized arguments"),
    "unknown subcommand": (lambda w: ["frobnicate"], "frobnicate"),
    **{f"{command}: unknown option": ((lambda c: lambda w: [c, *_REQUIRED_ARGS(w).get(c, []), "--frobnicate"])(command),
                                      "unrecognized arguments: --frobnicate") for command in COMMANDS},
    # ----- out-of-range numbers
    "run: zero envs": (lambda w: w.run(PRESET, "--set", "env.num_envs=0"), "env.num_envs"),
    "config: too many envs": (lambda w: ["config", PRESET, "--set", "env.num_envs=5000"], "env.num_envs"),
    "config: gamma above 1": (lambda w: ["config", PRESET, "--set", "ppo.gamma=1.5"], "ppo.gamma"),
    "run: negative seed": (lambda w: w.run(PRESET, "--seed", "-1"), "seed"),
    "config: absurd step budget": (lambda w: ["config", PRESET, "--steps", str(10**13)], "run.steps"),
    "config: integer beyond 64 bits": (lambda w: ["config", PRESET, "--set", "seed=" + "9" * 30], "seed"),
    "gate: zero repeats": (lambda w: ["gate", "--run", PRESET, "--repeats", "0"], "run.repeats"),
    "gate: slowdown above 100 %": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                              "--max-slowdown", "150"], "--max-slowdown"),
    "gate: negative minimum speedup": (lambda w: ["gate", "--run", PRESET, "--min-speedup", "-1"], "--min-speedup"),
    "compare: confidence above 1": (lambda w: ["compare", str(w.good), "--confidence", "1.5"], "confidence"),
    "config: minibatches that do not divide the batch": (lambda w: ["config", PRESET, "--set",
                                                                    "ppo.num_minibatches=1000"], "ppo.num_minibatches"),
    # ----- NaN and infinity
    "run: NaN learning rate": (lambda w: w.run(PRESET, "--set", "ppo.learning_rate=.nan"), "finite"),
    "config: 'nan' learning rate": (lambda w: ["config", PRESET, "--set", "ppo.learning_rate=nan"], "finite"),
    "gate: infinite gamma": (lambda w: ["gate", "--run", PRESET, "--set", "ppo.gamma=.inf"], "ppo.gamma"),
    "config: -inf in YAML": (lambda w: ["config", w.text("c.yaml", "stability: {max_grad_norm: -.inf}\n")],
                             "stability.max_grad_norm"),
    "gate: NaN max slowdown": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                          "--max-slowdown", "nan"], "finite"),
    "gate: infinite minimum speedup": (lambda w: ["gate", "--run", PRESET, "--min-speedup", "inf"], "finite"),
    "compare: infinite confidence": (lambda w: ["compare", str(w.good), "--confidence", "inf"], "confidence"),
    "gate: NaN in thresholds": (lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good),
                                           "--thresholds", w.text("t.yaml", "max_slowdown_pct: .nan\n")], "finite"),
    # ----- unknown presets and env ids
    "run: unknown preset": (lambda w: w.run("ppo-cartpol"), "did you mean 'ppo-cartpole'"),
    "config: unknown preset": (lambda w: ["config", "dqn-pongg"], "unknown preset"),
    "ablate: unknown preset": (lambda w: ["ablate", "ppo-cartpol"], "did you mean 'ppo-cartpole'"),
    "calibrate: unknown preset": (lambda w: ["calibrate", "ppo-cartpol"], "did you mean 'ppo-cartpole'"),
    "calibrate: two repeats": (lambda w: ["calibrate", PRESET, "--repeats-grid", "2,3"], "power rule"),
    "sweep: unknown preset": (lambda w: ["sweep", "nope", "--param", "env.num_envs=1,2"], "unknown preset"),
    "sweep: unknown key": (lambda w: ["sweep", PRESET, "--param", "env.num_env=1,2"], "env.num_env"),
    "diagnose: unknown preset": (lambda w: ["diagnose", "nope"], "unknown preset"),
    "ablate: unknown flag": (lambda w: ["ablate", PRESET, "--flags", "warp_drive"], "warp_drive"),
    "gate: unknown preset": (lambda w: ["gate", "--run", "nope"], "unknown preset"),
    "run: missing config file": (lambda w: w.run(str(w.root / "nowhere.yaml")), "not found"),
    "run: unknown env id": (lambda w: w.run(PRESET, "--set", "env.id=Nope-v0"), "env.id"),
    "config: unversioned env id": (lambda w: ["config", PRESET, "--set", "env.id=CartPole"], "did you mean"),
    "config: env module that does not exist": (lambda w: ["config", PRESET, "--set", "env.id=no_such_mod:X-v0"],
                                               "cannot import module"),
    "run: env kwarg the env does not take": (lambda w: w.run(PRESET, "--set", "env.kwargs.gravity=1"), "env.kwargs"),
    "config: continuous env for DQN": (lambda w: ["config", "dqn-cartpole", "--set", "env.id=Pendulum-v1"],
                                       "Discrete"),
    # ----- corrupt or foreign result files
    "compare: truncated file": (lambda w: ["compare", w.text("r.json", w.good.read_text()[:200]), str(w.good)],
                                "not valid JSON"),
    "compare: empty file": (lambda w: ["compare", w.text("r.json", ""), str(w.good)], "not valid JSON"),
    "compare: not UTF-8": (lambda w: ["compare", w.text("r.json", b"\x89PNG\r\n\xff"), str(w.good)], "cannot read"),
    "compare: a folder": (lambda w: ["compare", str(w.root), str(w.good)], "cannot read"),
    "compare: a JSON list": (lambda w: ["compare", w.text("r.json", "[1, 2]"), str(w.good)],
                             "not an rlgauge result file"),
    "compare: schema_version 2": (lambda w: ["compare", w.result("r.json", lambda p: p.update(schema_version=2)),
                                             str(w.good)], "schema_version 2"),
    "compare: schema_version as text": (lambda w: ["compare", w.result("r.json",
                                                                       lambda p: p.update(schema_version="1"))],
                                        "schema_version '1'"),
    "compare: rate samples are text": (lambda w: ["compare", w.result("r.json", _edit(0, "metrics.env_steps_per_sec",
                                                                                        {"median": "fast"}))],
                                       "metrics.env_steps_per_sec"),
    "compare: NaN rate sample": (lambda w: ["compare", w.result("r.json", _edit(
        1, "metrics.env_steps_per_sec.samples", [float("nan")]))], "finite"),
    "compare: latency is a list": (lambda w: ["compare", w.result("r.json", _edit(0, "metrics.inference_latency_ms",
                                                                                  [1, 2]))], "inference_latency_ms"),
    "gate: run is a string": (lambda w: ["gate", "--baseline", w.result("r.json", lambda p: p.update(runs=["x"])),
                                         "--candidate", str(w.good)], "run 0"),
    "gate: stability is text": (lambda w: ["gate", "--baseline", str(w.good), "--candidate",
                                           w.result("r.json", _edit(1, "stability", "fine"))], "stability"),
    "gate: stability without its counts": (lambda w: ["gate", "--baseline", str(w.good), "--candidate",
                                                      w.result("r.json", _edit(1, "stability", {}))],
                                           "stability.float64_ops"),
    "gate: metrics without rates": (lambda w: ["gate", "--baseline", w.result("r.json", _edit(0, "metrics", {})),
                                               "--candidate", str(w.good)], "metrics.env_steps_per_sec"),
    "gate: an asv results file": (lambda w: ["gate", "--baseline", w.text("r.json", '{"results": {}, "params": {}}'),
                                             "--candidate", str(w.good)], "not an rlgauge result file"),
    "record: git is a list": (lambda w: ["record", "--milestone", "m", w.result("r.json", _edit(0, "git", [1]))],
                              "git"),
    "record: started_at is a number": (lambda w: ["record", "--milestone", "m",
                                                  w.result("r.json", _edit(0, "started_at", 5))], "started_at"),
    "record: run without stability": (lambda w: ["record", "--milestone", "m",
                                                 w.result("r.json", _delete(1, "stability"))], "missing stability"),
    "record: status unknown": (lambda w: ["record", "--milestone", "m",
                                          w.result("r.json", _edit(0, "status", "great"))], "'great'"),
    "record: one bad file among good ones": (lambda w: ["record", "--milestone", "m", str(w.good),
                                                        w.text("r.json", "{")], "not valid JSON"),
    "record: missing result file": (lambda w: ["record", "--milestone", "m", str(w.root / "nope.json")], "not found"),
    # ----- RUNS.md that cannot take a row
    "record: RUNS.md row with three cells": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md",
                                                        w.text("R.md", BROKEN_ROW)], "broken table row"),
    "record: RUNS.md without the separator": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md",
                                                         w.text("R.md", new_file_text().replace("|---", "|..."))],
                                              "separator"),
    "record: RUNS.md text after the table": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md",
                                                        w.text("R.md", new_file_text() + "\nnotes\n")],
                                             "text after the milestone table"),
    "record: RUNS.md with a foreign table": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md",
                                                        w.text("R.md", "| a | b |\n|---|---|\n")], "not rlgauge's"),
    "record: RUNS.md not UTF-8": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md",
                                             w.text("R.md", b"\xff\xfe| x |")], "cannot read"),
    "record: RUNS.md is a folder": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md", str(w.root)],
                                    "is a directory"),
    "record: RUNS.md folder missing": (lambda w: ["record", "--milestone", "m", str(w.good), "--runs-md",
                                                  str(w.root / "no" / "RUNS.md")], "does not exist"),
    "record: two-line milestone": (lambda w: ["record", "--milestone", "a\nb", str(w.good)], "--milestone"),
    # ----- --out that cannot be written: refused before the run starts
    "run: --out is a folder": (lambda w: ["run", PRESET, "--out", str(w.root)], "is a directory"),
    "run: --out below a file": (lambda w: ["run", PRESET, "--out", str(w.good / "r.json")], "is a file"),
    "gate: --out is a folder": (lambda w: ["gate", "--run", PRESET, "--out", str(w.root)], "is a directory"),
    **({"run: --out where no file can be created": (lambda w: ["run", PRESET, "--out", "/proc/r.json"],
                                                    "cannot create files in /proc")}
       if Path("/proc/self").is_dir() else {}),
    # ----- arguments missing or mixed
    "compare: no files": (lambda w: ["compare"], "required"),
    "compare: three files": (lambda w: ["compare", str(w.good), str(w.good), str(w.good)], "one or two"),
    "gate: neither mode": (lambda w: ["gate"], "either --baseline"),
    "record: no milestone": (lambda w: ["record", str(w.good)], "--milestone"),
    "run: no target": (lambda w: ["run"], "required"),
    "config: --variant unknown": (lambda w: ["config", PRESET, "--variant", "fast"], "--variant"),
    "run: --variant list with an unknown name": (
        lambda w: ["run", PRESET, "--variant", "optimized,fast", "--out", str(w.root / "r.json")],
        f"--variant optimized,fast: {PRESET} defines no variant 'fast'; defined: baseline, optimized"),
    "run: --variant list with an empty name": (lambda w: ["run", PRESET, "--variant", "baseline,"], "an empty name"),
    "gate: --variant with the result files": (
        lambda w: ["gate", "--baseline", str(w.good), "--candidate", str(w.good), "--variant", "all"],
        "--variant applies to --run only"),
}


def _snapshot(root: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def test_every_subcommand_is_covered() -> None:
    commands = {name.split(":")[0] for name in CASES if ":" in name}
    assert set(COMMANDS) <= commands


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_and_changes_no_file(case: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # record's default RUNS.md is the workspace's
    build, needle = CASES[case]
    argv = build(Workspace(tmp_path))
    before = _snapshot(tmp_path)

    code = main(argv)
    out, err = capsys.readouterr()

    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and err.startswith("rlgauge: error: "), err
    assert needle in err, err
    assert "Traceback" not in out + err and out == ""
    after = _snapshot(tmp_path)
    assert {p: h for p, h in after.items() if p in before} == before  # no existing file changed
    assert [p.name for p in after if p not in before and p.suffix != ".lock"] == []  # and nothing new but a lock
    assert not (tmp_path / "pwned").exists()


def test_yaml_is_read_only_with_safe_loaders() -> None:
    """Every YAML read in the packages goes through ``safe_load`` (a SafeLoader subclass) or ``yaml.safe_load``."""
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for path in [*root.glob("harness/**/*.py"), *root.glob("reference_trainers/**/*.py"), *root.glob("benchmarks/*.py")]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if "yaml.load(" in line and "Loader=_Yaml12Loader" not in line or "yaml.unsafe_load" in line \
                    or "yaml.full_load" in line or "Loader=yaml.Loader" in line:
                offenders.append(f"{path.relative_to(root)}:{number}")
    assert offenders == []


# --------------------------------------------------------------------------- random input to `rlgauge config`

KEYS = ["algo", "seed", "device", "env", "env.id", "env.num_envs", "env.vectorization", "env.action_repeat",
        "env.kwargs", "model.hidden_sizes", "model.activation", "ppo.learning_rate", "ppo.num_steps", "ppo.gamma",
        "ppo.num_minibatches", "dqn.buffer_size", "dqn.batch_size", "optimizations.amp", "optimizations.replay",
        "optimizations.torch_threads", "optimizations.inference_batch_size", "stability.nan_policy",
        "stability.max_grad_norm", "run.steps", "run.repeats", "variants", "description", "config"]
_text = st.text(st.characters(codec="utf-8", exclude_characters=":", exclude_categories=("Cs",)), max_size=12)
_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
            | _text | st.sampled_from(["auto", "cpu", "CartPole-v1", "Nope-v0", "sync", "tensor", "raise", "ppo", "dqn"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(KEYS) | _text, inner, max_size=3), max_leaves=8)


def _nest(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``[("env.num_envs", 3)]`` -> ``{"env": {"num_envs": 3}}`` (later keys win)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        node = out
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return out


_documents = (st.lists(st.tuples(st.sampled_from(KEYS) | _text.filter(bool), _values), max_size=6).map(_nest)
              .map(lambda d: yaml.safe_dump(d, allow_unicode=True))
              | st.text(max_size=80))
_set_strings = st.tuples(st.sampled_from(KEYS) | _text, st.sampled_from(["=", "", "=="]),
                         _text | _scalars.map(lambda v: yaml.safe_dump(v).removesuffix("\n...\n").strip())
                         ).map("".join)


def _config(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


def _assert_clean(code: int, output: str) -> None:
    assert code in (0, 2), output
    assert "Traceback" not in output
    if code == 2:
        assert output.startswith("rlgauge: error: ") and len(output.splitlines()) == 1, output


@given(document=_documents)
def test_random_yaml_files_give_a_config_or_one_line_error(document: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "random.yaml"
        path.write_text(document, encoding="utf-8")
        _assert_clean(*_config(["config", str(path)]))


@given(overrides=st.lists(_set_strings, min_size=1, max_size=4))
def test_random_set_strings_give_a_config_or_one_line_error(overrides: list[str]) -> None:
    _assert_clean(*_config(["config", PRESET, *[arg for item in overrides for arg in ("--set", item)]]))


# --------------------------------------------------------------------------- top-level options: --version, --debug, RLGAUGE_DEBUG
# (issue 18, CLI polish) Each case: (environment, argv builder, needle); checked as CASES are.

TOP_LEVEL_CASES: dict[str, tuple[dict[str, str], Callable[[Workspace], list[str]], str]] = {
    "RLGAUGE_DEBUG=maybe": ({"RLGAUGE_DEBUG": "maybe"}, lambda w: ["presets"], "accepted: 1 or true"),
    "RLGAUGE_DEBUG=2 before a run": ({"RLGAUGE_DEBUG": "2"}, lambda w: w.run(PRESET), "RLGAUGE_DEBUG='2'"),
    "RLGAUGE_DEBUG=yes before record": ({"RLGAUGE_DEBUG": "yes"},
                                        lambda w: ["record", "--milestone", "m", str(w.good)], "RLGAUGE_DEBUG"),
    "--version with a value": ({}, lambda w: ["--version=3"], "ignored explicit argument"),
    "--debug with a value": ({}, lambda w: ["--debug=1", "presets"], "ignored explicit argument"),
    "run --debug with a value": ({}, lambda w: [*w.run(PRESET), "--debug=yes"], "ignored explicit argument"),
    "--debug without a command": ({}, lambda w: ["--debug"], "required"),
}


@pytest.mark.parametrize("case", list(TOP_LEVEL_CASES))
def test_bad_top_level_options_exit_2_with_one_line(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RLGAUGE_DEBUG", raising=False)
    env, build, needle = TOP_LEVEL_CASES[case]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = build(Workspace(tmp_path))
    before = _snapshot(tmp_path)

    code = main(argv)
    out, err = capsys.readouterr()

    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and err.startswith("rlgauge: error: ") and needle in err, err
    assert "Traceback" not in out + err and out == ""
    assert _snapshot(tmp_path) == before  # nothing changed, nothing new


# --------------------------------------------------------------------------- config input holes (issue 18)
# Unsupported spaces, duplicate YAML keys, strict types, empty configs, unreadable checkpoints and
# the standalone trainers' step budget: each is one line and exit 2 before anything runs.

def _torch_file(payload: object, keep: float = 1.0) -> bytes:
    """``torch.save(payload)`` as bytes, cut to the first ``keep`` share of them."""
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getvalue()
    return data[:int(len(data) * keep)]


_CHECKPOINT = {"format": "rlgauge-checkpoint", "version": 1, "kind": "run", "weights": list(range(1000))}

INPUT_HOLE_CASES: dict[str, tuple[Callable[[Workspace], list[str]], str]] = {
    # ----- observation and action spaces the trainers cannot take
    "config: env with Tuple observations": (lambda w: ["config", PRESET, "--set", "env.id=Blackjack-v1"],
                                            "env.id: 'Blackjack-v1' has observation space Tuple("),
    "run: env with Tuple observations": (lambda w: w.run(PRESET, "--set", "env.id=Blackjack-v1"),
                                         "accepted: an env with Box observations"),
    "config: DQN on Tuple observations": (lambda w: ["config", "dqn-cartpole", "--set", "env.id=Blackjack-v1"],
                                          "observation space Tuple("),
    # ----- duplicate keys
    "config: duplicate YAML key": (lambda w: ["config", w.text("c.yaml", "env:\n  id: CartPole-v1\n  id: Acrobot-v1\n")],
                                   "duplicate key 'id' at lines 2 and 3"),
    "run: duplicate key in a preset file": (lambda w: w.run(w.text(
        "p.yaml", "config: {algo: ppo}\nvariants: {baseline: {}}\nconfig: {algo: dqn}\n")),
        "duplicate key 'config' at lines 1 and 3"),
    # ----- strict types: no string becomes a number or a switch
    "config: quoted count": (lambda w: ["config", w.text("c.yaml", 'env: {num_envs: "16"}\n')],
                             "env.num_envs: invalid value '16': expected an integer"),
    "run: quoted switch": (lambda w: w.run(w.text("c.yaml", 'ppo: {anneal_lr: "yes"}\n')),
                           "ppo.anneal_lr: invalid value 'yes': expected a boolean"),
    "config: quoted flag": (lambda w: ["config", w.text("c.yaml", 'optimizations: {num_workers: "1"}\n')],
                            "optimizations.num_workers"),
    "config: quoted bool-or-auto flag": (lambda w: ["config", w.text("c.yaml", 'optimizations: {amp: "false"}\n')],
                                         "expected true, false or 'auto'"),
    "config: quoted tuning": (lambda w: ["config", w.text("c.yaml", 'tuning: {noise_block_steps: "256"}\n')],
                              "tuning.noise_block_steps"),
    "config: float for a count": (lambda w: ["config", w.text("c.yaml", "run: {repeats: 3.0}\n")], "run.repeats"),
    # ----- configs that say nothing
    "run: empty YAML file": (lambda w: w.run(w.text("c.yaml", "")), "is empty"),
    "config: YAML of comments only": (lambda w: ["config", w.text("c.yaml", "# to do\n")], "is empty"),
    "run: preset file without config": (lambda w: w.run(w.text(
        "p.yaml", "description: d\nvariants: {baseline: {}, optimized: {}}\n")), "needs config:"),
    # ----- checkpoints that cannot be read
    "run: --resume junk": (lambda w: w.run(PRESET, "--resume", w.text("c.pt", b"\x00garbage")),
                           "not a readable checkpoint"),
    "run: --resume a truncated checkpoint": (lambda w: w.run(PRESET, "--resume",
                                                             w.text("c.pt", _torch_file(_CHECKPOINT, 0.6))), "truncated"),
    "run: --resume a checkpoint holding Python objects": (lambda w: w.run(PRESET, "--resume", w.text(
        "c.pt", _torch_file({**_CHECKPOINT, "evil": Path("x")}))), "not made by rlgauge"),
}


@pytest.mark.parametrize("case", list(INPUT_HOLE_CASES))
def test_input_holes_exit_2_with_one_line_before_anything_runs(case: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    build, needle = INPUT_HOLE_CASES[case]
    argv = build(Workspace(tmp_path))
    before = _snapshot(tmp_path)

    code = main(argv)
    out, err = capsys.readouterr()

    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and err.startswith("rlgauge: error: ") and needle in err, err
    assert "Traceback" not in out + err and out == ""
    assert "weights_only" not in err  # never the advice to unpickle an untrusted file
    after = _snapshot(tmp_path)
    assert {p: h for p, h in after.items() if p in before} == before
    assert [p.name for p in after if p not in before and p.suffix != ".lock"] == []


@pytest.mark.parametrize("algo", ["ppo", "dqn", "iqn"])
@pytest.mark.parametrize("steps", ["-1", "0", "ten"])
def test_standalone_trainer_step_budget_below_1_is_an_argparse_error(algo: str, steps: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    config = tmp_path / "c.yaml"
    config.write_text("env: {id: CartPole-v1}\n", encoding="utf-8")
    module = importlib.import_module({"ppo": "reference_trainers.ppo.trainer"}.get(algo, f"reference_trainers.value.{algo}"))
    with pytest.raises(SystemExit) as info:
        module.main(["--config", str(config), "--steps", steps])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert "argument --steps" in err.splitlines()[-1] and "accepted: an integer >= 1" in err, err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- output targets never destroyed (issue 18)
# FIFOs, symlinks, read-only files and folders, and directories as the targets of run --out,
# gate --out, record --runs-md, the folders of matrix/ablate/sweep/calibrate and --checkpoint-dir:
# each is refused before anything runs (exit 2, one line) and every entry is left exactly as it
# was (a FIFO still a FIFO, a link still the same link, each file's bytes and mode). Never /dev/*.

def _fifo(w: Workspace, name: str) -> str:
    path = w.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return str(path)


def _read_only(w: Workspace, name: str, content: bytes = b"kept\n") -> str:
    path = w.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(0o444)
    return str(path)


def _link(w: Workspace, name: str, target: str) -> str:
    path = w.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return str(path)


def _folder(w: Workspace, name: str, mode: int = 0o755) -> str:
    path = w.root / name
    path.mkdir(parents=True)
    path.chmod(mode)
    return str(path)


def _parent(path: str) -> str:
    """The folder holding ``path`` (the output folder a case's bad entry lies in)."""
    return str(Path(path).parent)


def _small(command: str, *more: str) -> list[str]:
    return [command, PRESET, "--set", "device=cpu", "--steps", "64", *more]


def _record(w: Workspace, runs_md: str) -> list[str]:
    return ["record", "--milestone", "m", str(w.good), "--runs-md", runs_md]


def _matrix(out: str) -> list[str]:
    return ["matrix", "--presets", PRESET, "--set", "device=cpu", "--out", out]


def _checkpoints(folder: str) -> list[str]:
    return _small("run", "--checkpoint-every", "32", "--checkpoint-dir", folder)


_CKPT = f"ck/{PRESET}.ckpt.pt"
_CRLF_RUNS_MD = new_file_text().replace("\n", "\r\n").encode("utf-8")

UNSAFE_TARGET_CASES: dict[str, tuple[Callable[[Workspace], list[str]], str]] = {
    # ----- run / gate --out
    "run: --out is a FIFO": (lambda w: _small("run", "--out", _fifo(w, "r.json")), "r.json: is a FIFO"),
    "run: --out is read-only": (lambda w: _small("run", "--out", _read_only(w, "r.json")), "is read-only"),
    "run: --out links to a read-only file": (lambda w: _small("run", "--out", _link(
        w, "r.json", _read_only(w, "real.json"))), "r.json: is read-only"),
    "run: --out links to a FIFO": (lambda w: _small("run", "--out", _link(w, "r.json", _fifo(w, "p"))), "is a FIFO"),
    "run: --out below a FIFO": (lambda w: _small("run", "--out", _fifo(w, "p") + "/r.json"),
                                "is a FIFO (named pipe), not a directory"),
    "run: --out in a read-only folder": (lambda w: _small("run", "--out", _folder(w, "ro", 0o555) + "/r.json"),
                                         "not writable"),
    "gate: --out is a FIFO": (lambda w: ["gate", "--run", PRESET, "--set", "device=cpu", "--steps", "64",
                                         "--repeats", "3", "--out", _fifo(w, "r.json")], "is a FIFO"),
    # ----- record --runs-md
    "record: RUNS.md is a FIFO": (lambda w: _record(w, _fifo(w, "R.md")), "R.md: is a FIFO"),
    "record: RUNS.md is read-only": (lambda w: _record(w, _read_only(w, "R.md", new_file_text().encode())),
                                     "is read-only"),
    "record: read-only CRLF RUNS.md": (lambda w: _record(w, _read_only(w, "R.md", _CRLF_RUNS_MD)), "is read-only"),
    "record: RUNS.md links to a read-only file": (lambda w: _record(w, _link(w, "R.md", _read_only(w, "docs/RUNS.md"))),
                                                  "R.md: is read-only"),
    "record: RUNS.md links to a FIFO": (lambda w: _record(w, _link(w, "R.md", _fifo(w, "p"))), "is a FIFO"),
    # ----- output folders, and the files the command would write in them
    "matrix: --out is a FIFO": (lambda w: _matrix(_fifo(w, "m")), "is a FIFO (named pipe); give a folder"),
    "matrix: --out is a file": (lambda w: _matrix(str(w.out)), "is a file; give a folder"),
    "matrix: --out links to a FIFO": (lambda w: _matrix(_link(w, "m", _fifo(w, "p"))), "is a FIFO"),
    "matrix: report.html is a FIFO": (lambda w: _matrix(_parent(_fifo(w, "m/report.html"))), "report.html: is a FIFO"),
    "matrix: runs.json is a folder": (lambda w: _matrix(_parent(_folder(w, "m/runs.json"))),
                                      "runs.json: is a directory"),
    "matrix: runs.json is read-only": (lambda w: _matrix(_parent(_read_only(w, "m/runs.json"))), "is read-only"),
    "matrix: --out folder is read-only": (lambda w: _matrix(_folder(w, "m", 0o555)), "not writable"),
    "ablate: --out is a FIFO": (lambda w: ["ablate", PRESET, "--set", "device=cpu", "--out", _fifo(w, "a")],
                                "is a FIFO"),
    "ablate: ablation.png is a FIFO": (lambda w: ["ablate", PRESET, "--set", "device=cpu", "--out",
                                                  _parent(_fifo(w, "a/ablation.png"))], "ablation.png: is a FIFO"),
    "sweep: sweep.json is read-only": (lambda w: ["sweep", PRESET, "--param", "env.num_envs=2,4", "--set", "device=cpu",
                                                  "--out", _parent(_read_only(w, "s/sweep.json"))],
                                       "sweep.json: is read-only"),
    "calibrate: --out is a FIFO": (lambda w: ["calibrate", PRESET, "--set", "device=cpu", "--out", _fifo(w, "c")],
                                   "is a FIFO"),
    # ----- --checkpoint-dir and the checkpoint file in it
    "run: --checkpoint-dir is a FIFO": (lambda w: _checkpoints(_fifo(w, "ck")),
                                        "is a FIFO (named pipe), not a directory"),
    "run: --checkpoint-dir is a file": (lambda w: _checkpoints(str(w.out)), "is a file, not a directory"),
    "run: --checkpoint-dir is read-only": (lambda w: _checkpoints(_folder(w, "ck", 0o555)), "not writable"),
    "run: the checkpoint file is a folder": (lambda w: _checkpoints(_parent(_folder(w, _CKPT))), "is a directory"),
    "run: the checkpoint file is read-only": (lambda w: _checkpoints(_parent(_read_only(w, _CKPT))),
                                              "ckpt.pt: is read-only"),
    "run: the checkpoint file links to a FIFO": (lambda w: _checkpoints(_parent(_link(w, _CKPT, _fifo(w, "p")))),
                                                 "is a FIFO"),
}


def _entries(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every entry below ``root`` (links not followed): its kind, mode, and bytes' hash or link target."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            what = "-> " + os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            what = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            what = ""
        out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), what)
    return out


@pytest.mark.parametrize("case", list(UNSAFE_TARGET_CASES))
def test_unsafe_output_targets_exit_2_and_are_left_as_they_were(case: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    build, needle = UNSAFE_TARGET_CASES[case]
    argv = build(Workspace(tmp_path))
    before = _entries(tmp_path)

    code = main(argv)
    out, err = capsys.readouterr()

    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and err.startswith("rlgauge: error: ") and needle in err, err
    assert "Traceback" not in out + err and out == ""
    assert _entries(tmp_path) == before  # every file, FIFO, link and folder as it was; nothing new


# --------------------------------------------------------------------------- analysis input holes (issue 18)
# Result files that contradict themselves, gates across different setups, and sweeps or matrices
# above the size limit: each is one line and exit 2, nothing written.

def _rate(samples: list[float], **block: float) -> dict[str, Any]:
    return {"median": sorted(samples)[len(samples) // 2], "min": min(samples), "max": max(samples),
            "samples": samples, **block}


def _gate_against(w: Workspace, edit: Callable[[dict[str, Any]], Any]) -> list[str]:
    return ["gate", "--baseline", str(w.good), "--candidate", w.result("c.json", edit)]


_VALUES = lambda n: ",".join(str(i) for i in range(1, n + 1))  # noqa: E731

ANALYSIS_CASES: dict[str, tuple[Callable[[Workspace], list[str]], str]] = {
    # ----- a result file that contradicts itself
    "compare: fewer samples than repeats": (lambda w: ["compare", w.result("r.json", _edit(
        0, "metrics.env_steps_per_sec", _rate([1000.0, 1010.0])))],
        "r.json run 0: metrics.env_steps_per_sec.samples: 2 samples, but config.run.repeats is 3"),
    "gate: min above max": (lambda w: _gate_against(w, _edit(1, "metrics.env_steps_per_sec", _rate(
        [1000.0], min=1100.0, max=900.0))), "c.json run 1: metrics.env_steps_per_sec: min 1100 is greater than max 900"),
    "record: a sample outside its own min-max": (lambda w: ["record", "--milestone", "m", w.result("r.json", _edit(
        0, "metrics.updates_per_sec", _rate([4.0, 3.9], max=4.0) | {"samples": [4.0, 3.9, 40.0]}))],
        "metrics.updates_per_sec: sample 40 lies outside its own [min, max]"),
    "compare: fewer timed steps than repeats x steps": (lambda w: ["compare", w.result("r.json", _edit(
        1, "steps_completed", 100))], "r.json run 1: steps_completed: 100 timed env steps, fewer than"),
    "gate: trustworthy with reasons": (lambda w: _gate_against(w, _edit(1, "quality", {
        "trustworthy": True, "reasons": ["other processes took 60 %"]})), "c.json run 1: quality: trustworthy is true"),
    "record: untrustworthy without a reason": (lambda w: ["record", "--milestone", "m", w.result("r.json", _edit(
        0, "quality", {"trustworthy": False, "reasons": []}))], "quality: trustworthy is false but no reason"),
    # ----- gates across different setups
    "gate: another env": (lambda w: _gate_against(w, _edit(1, "config.env.id", "Acrobot-v1")),
                          "differ in setup: env.id CartPole-v1 vs Acrobot-v1"),
    "gate: another algorithm": (lambda w: _gate_against(w, _edit(1, "algo", "dqn")), "differ in setup: algo ppo vs dqn"),
    "gate: another number of envs": (lambda w: _gate_against(w, _edit(1, "config.env.num_envs", 4)),
                                     "env.num_envs 16 vs 4 (accepted: runs of the same algorithm, env and batch shape"),
    # ----- sweeps and matrices above the size limit
    "sweep: a 201 x 50 grid": (lambda w: ["sweep", PRESET, "--param", f"seed={_VALUES(201)}", "--param",
                                          f"env.num_envs={_VALUES(50)}", "--set", "device=cpu"],
                               "sweep: 10,050 runs of about"),
    "sweep: 51 points": (lambda w: ["sweep", PRESET, "--param", f"seed={_VALUES(51)}", "--set", "device=cpu"],
                         "more than the 50 runs it takes without --yes: pass --yes"),
    "sweep: too many env steps": (lambda w: ["sweep", PRESET, "--param", "env.num_envs=2,4", "--set", "device=cpu",
                                             "--steps", str(10**7)], "more than the 20,000,000 env steps"),
    "matrix: too many env steps": (lambda w: ["matrix", "--presets", PRESET, "--set", "device=cpu", "--steps",
                                              str(10**7)], "matrix: 2 runs of 30,002,048 env steps each"),
}


@pytest.mark.parametrize("case", list(ANALYSIS_CASES))
def test_analysis_input_holes_exit_2_with_one_line_and_write_nothing(case: str, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # sweep's and matrix's default output folders are the workspace's
    build, needle = ANALYSIS_CASES[case]
    argv = build(Workspace(tmp_path))
    before = _snapshot(tmp_path)

    code = main(argv)
    out, err = capsys.readouterr()

    assert code == 2, out + err
    assert len(err.splitlines()) == 1 and err.startswith("rlgauge: error: ") and needle in err, err
    assert "Traceback" not in out + err and out == ""
    assert _snapshot(tmp_path) == before  # nothing changed, nothing new
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == []  # no output folder either
