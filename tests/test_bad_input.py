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
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import COMMANDS, main
from harness.runs_md import new_file_text
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
                            "sweep": [PRESET, "--param", "env.num_envs=1,2"]}

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
