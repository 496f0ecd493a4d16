"""Reference effects: ``ablate --effects`` writes them, ``effect_of`` quotes them as the reference trainers'."""

from __future__ import annotations

import importlib.resources
import json
import tomllib
from pathlib import Path

import pytest

from conftest import TINY
from harness.analyses.ablate import ablation_json, flag_effects, plan_ablation
from harness.cli import main
from harness.diagnosis import reference_effects as ref
from harness.diagnosis.reference_effects import (DEFAULT_PATH, ReferenceEffectsError, effect_of, effects_for,
                                                 entries_from_ablation, read_effects, record_effects)
from results_factory import make_result

CPU = ["device=cpu"]
ROOT = Path(__file__).resolve().parents[1]


def _ablation(preset: str = "ppo-cartpole", scale: float = 1.0, untrustworthy: list[str] | None = None) -> dict:
    """An ``ablation.json`` of two flags measured by hand-made runs: batch_inference 1.5x alone (x ``scale``)."""
    plan = plan_ablation(preset, CPU, ["batch_inference", "torch_threads"])
    samples = {"baseline": [100, 200, 100, 100, 100], "+batch_inference": [150 * scale, 300 * scale, 150 * scale,
                                                                           150 * scale, 150 * scale],
               "+torch_threads": [101, 198, 100, 99, 102], "all-on": [300, 600, 300, 300, 300],
               "-batch_inference": [100, 200, 100, 100, 100], "-torch_threads": [290, 610, 300, 305, 300]}
    runs = [make_result(arm, values, preset=plan.preset, untrustworthy=untrustworthy if arm == "baseline" else None)
            for arm, values in samples.items()]
    return json.loads(json.dumps(ablation_json(plan, runs, flag_effects(plan, runs))))


def test_written_entries_read_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    entries = entries_from_ablation(_ablation(), ["device=cpu", "run.repeats=5"])
    assert record_effects(path, entries) == (2, 0)
    assert read_effects(path) == entries
    first = entries[0]
    assert (first.flag, first.key, first.preset, first.device) == ("batch_inference", "optimizations.batch_inference",
                                                                   "ppo-cartpole", "cpu")
    assert (first.change.from_, first.change.to) == (False, True) and first.settings == []
    assert first.alone is not None and first.alone.median == pytest.approx(1.5) and first.alone.bracket == "interval"
    assert (first.measured, first.machine, first.torch) == ("2026-01-02", "2-core Intel Xeon (x86-64) CPU", "2.13.0+cpu")
    assert (first.commit, first.dirty, first.trustworthy) == ("0123456789abcdef", False, True)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["schema_version"] == 1 and data["entries"][0]["change"] == {"from": False, "to": True}


def test_a_new_measurement_replaces_its_preset_device_and_flag_only(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(_ablation("ppo-cartpole"), []))
    record_effects(path, entries_from_ablation(_ablation("dqn-cartpole"), []))
    assert record_effects(path, entries_from_ablation(_ablation("ppo-cartpole", scale=2.0), [])) == (0, 2)
    entries = read_effects(path)
    assert len(entries) == 4
    alone = {(e.preset, e.flag): e.alone.median for e in entries if e.alone is not None}
    assert alone[("ppo-cartpole", "batch_inference")] == pytest.approx(3.0)
    assert alone[("dqn-cartpole", "batch_inference")] == pytest.approx(1.5)


def test_figures_are_labelled_as_the_reference_trainers(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(_ablation("ppo-cartpole"), []))
    line = effect_of("batch_inference", "cpu", path)
    assert line.startswith("reference trainers' figure (not yours): batch_inference (False -> True) alone on "
                           "ppo-cartpole: 1.50x [1.50-1.50]; measured 2026-01-02 on a 2-core Intel Xeon (x86-64) CPU")
    assert "untrustworthy" not in line and "yours" not in line.partition("(not yours)")[2]
    record_effects(path, entries_from_ablation(_ablation("dqn-cartpole", scale=0.8), []))
    both = effect_of("optimizations.batch_inference", "cpu", path)
    assert both.startswith("reference trainers' figures (not yours): batch_inference (False -> True) alone on ")
    assert "; on ppo-cartpole: 1.50x [1.50-1.50]; measured 2026-01-02" in both and "dqn-cartpole: 1.20x" in both
    assert both.count("measured 2026-01-02") == 1  # one date and machine for both figures


def test_figures_of_other_dates_or_machines_each_say_theirs(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    later = {**_ablation("dqn-cartpole"), "started_at": "2026-02-03T00:00:00+00:00"}
    record_effects(path, [*entries_from_ablation(_ablation("ppo-cartpole"), []), *entries_from_ablation(later, [])])
    line = effect_of("batch_inference", "cpu", path)
    assert "alone on dqn-cartpole: 1.50x [1.50-1.50], measured 2026-02-03 on a 2-core" in line
    assert line.endswith("; on ppo-cartpole: 1.50x [1.50-1.50]; measured 2026-01-02 on a 2-core Intel Xeon (x86-64) CPU")


def test_an_untrustworthy_measurement_is_kept_and_never_quoted(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(_ablation(untrustworthy=["other processes took 40% of the cores"]), []))
    line = effect_of("batch_inference", "cpu", path)
    assert line.startswith("no reference figure: rlgauge's measurement of batch_inference on a cpu device was not "
                           "trustworthy or not from a clean commit") and "1.50x" not in line
    assert effects_for("batch_inference", "cpu", path) == []
    assert read_effects(path)[0].reasons == ["other processes took 40% of the cores"]


def test_a_measurement_of_uncommitted_code_is_never_quoted(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    entries = [entry.model_copy(update={"dirty": True}) for entry in entries_from_ablation(_ablation(), [])]
    record_effects(path, entries)
    assert effect_of("batch_inference", "cpu", path).startswith("no reference figure")


def test_every_figure_diagnose_quotes_from_the_shipped_file_is_trustworthy_and_clean() -> None:
    """The shipped data file: whatever diagnose would quote from it was measured trustworthy from a clean commit."""
    from harness.diagnosis.reference_effects import DEFAULT_PATH, quotable

    entries = read_effects(DEFAULT_PATH)
    for flag in {e.flag for e in entries}:
        for device in ("cpu", "cuda", "mps"):
            for quoted in effects_for(flag, device, DEFAULT_PATH):
                assert quoted["trustworthy"] is True and quoted["dirty"] is False, quoted
    assert all(e.trustworthy and not e.dirty for e in quotable(entries))
    # and the file is not empty of figures: each shipped CPU preset has a quotable figure for batched inference
    for preset in ("ppo-cartpole", "dqn-cartpole"):
        assert [e for e in quotable(entries) if (e.preset, e.device, e.flag) == (preset, "cpu", "batch_inference")]


def test_no_figure_is_a_plain_statement(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(_ablation(), []))
    assert effect_of("optimizer_impl", "cpu", path) == ("no reference figure: rlgauge has not measured optimizer_impl "
                                                        "on a cpu device")
    assert effect_of("batch_inference", "cuda:1", path) == ("no reference figure: rlgauge has not measured "
                                                            "batch_inference on a cuda device")
    assert effect_of(None, "cpu", path) == "no speed figure: rlgauge has no flag for this to measure on its trainers"
    assert effects_for("optimizer_impl", "cpu", path) == [] and effects_for(None, "cpu", path) == []


def test_structured_accessor_gives_the_files_entries_as_json(tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(_ablation(), []))
    found = effects_for("batch_inference", "cpu", path)
    assert len(found) == 1 and found[0]["preset"] == "ppo-cartpole" and found[0]["change"] == {"from": False, "to": True}
    assert found[0] == json.loads(path.read_text(encoding="utf-8"))["entries"][0]
    json.dumps(found)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not a reference-effects file: invalid JSON at line 1"),
    ('{"schema_version": 2, "entries": []}', "schema_version 2 is not one this rlgauge reads (1)"),
    ('[1, 2]', "not a reference-effects file (expected a JSON object with schema_version and entries)"),
    ('{"schema_version": 1, "entries": [{"flag": "x"}]}', "not a reference-effects file: entries.0.key: Field required"),
])
def test_a_corrupt_file_gives_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "effects.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ReferenceEffectsError) as err:
        effect_of("batch_inference", "cpu", path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)


def test_a_missing_file_is_an_error_to_read_and_new_to_write(tmp_path: Path) -> None:
    with pytest.raises(ReferenceEffectsError, match="no reference-effects file there"):
        read_effects(tmp_path / "none.json")
    assert read_effects(tmp_path / "none.json", missing_ok=True) == []


def test_the_packaged_file_is_found_in_the_package_not_in_docs() -> None:
    packaged = importlib.resources.files("harness.diagnosis") / "reference_effects.json"
    assert DEFAULT_PATH == Path(str(packaged)) and DEFAULT_PATH.is_file() and "docs" not in DEFAULT_PATH.parts
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "diagnosis/reference_effects.json" in pyproject["tool"]["setuptools"]["package-data"]["harness"]
    entries = read_effects()  # the default path
    assert {(e.preset, e.device) for e in entries} >= {("ppo-cartpole", "cpu"), ("dqn-cartpole", "cpu")}
    assert all(e.settings == [] for e in entries)  # the shipped presets as shipped, not a tiny run
    quoted = ref.quotable(ref.matching("batch_inference", "cpu", entries))
    assert effect_of("batch_inference", "cpu").startswith(
        "reference trainers' figure" if quoted else "no reference figure: rlgauge's measurement of batch_inference")


def test_vectorization_is_matched_by_its_short_name(tmp_path: Path) -> None:
    ablation = _ablation()
    flag = ablation["flags"][0]
    ablation["flags"] = [{**flag, "name": "env.vectorization", "key": "env.vectorization", "plain": "serial",
                          "resolved": "native"}]
    ablation["arms"]["+env.vectorization"] = ablation["arms"]["+batch_inference"]
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(ablation, []))
    assert effect_of("vectorization", "cpu", path).startswith(
        "reference trainers' figure (not yours): vectorization (serial -> native) alone on ppo-cartpole")


def test_a_flag_measured_in_the_stack_only_is_quoted_as_such(tmp_path: Path) -> None:
    ablation = _ablation()
    ablation["flags"][0]["alone"] = None
    path = tmp_path / "effects.json"
    record_effects(path, entries_from_ablation(ablation, []))
    assert "batch_inference (False -> True) in the full stack of ppo-cartpole (all-on / -flag): " \
        in effect_of("batch_inference", "cpu", path)


@pytest.mark.parametrize("cpu, short", [("Intel(R) Xeon(R) Processor", "Intel Xeon"),
                                        ("Intel(R) Xeon(R) CPU @ 2.20GHz", "Intel Xeon"),
                                        ("AMD EPYC 7B13 64-Core Processor", "AMD EPYC 7B13"), ("Apple M2", "Apple M2")])
def test_machine_is_described_short(cpu: str, short: str) -> None:
    assert ref.short_cpu(cpu) == short
    assert ref.machine_text({"cpu": cpu, "cores": 16, "device": "cuda:0", "device_name": "NVIDIA H200"}) == \
        f"NVIDIA H200 GPU (16-core {short} host)"


def test_ablate_effects_on_a_tiny_run_writes_an_entry(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "effects.json"
    sets = [a for item in TINY for a in ("--set", item)]
    code = main(["ablate", "ppo-cartpole", *sets, "--flags", "batch_inference", "--out", str(tmp_path / "abl"),
                 "--effects", str(path)])
    assert code == 0, capsys.readouterr().err
    assert "reference effects: 1 added, 0 replaced in" in capsys.readouterr().err
    (entry,) = read_effects(path)
    assert (entry.preset, entry.flag, entry.device, entry.repeats, entry.steps) == ("ppo-cartpole", "batch_inference",
                                                                                    "cpu", 1, 64)
    assert "model.hidden_sizes=[16,16]" in entry.settings and "device=cpu" not in entry.settings
    assert entry.alone is not None and entry.alone.bracket == "range" and entry.alone.n == 1
    line = effect_of("batch_inference", "cpu", path)
    if not ref.quotable([entry]):  # this checkout has uncommitted changes, or the machine was busy: kept, not quoted
        assert line.startswith("no reference figure: rlgauge's measurement of batch_inference")
        entry = entry.model_copy(update={"trustworthy": True, "dirty": False})
        path.unlink()
        record_effects(path, [entry])
        line = effect_of("batch_inference", "cpu", path)
    assert line.startswith("reference trainers' figure (not yours): batch_inference (False -> True) alone on "
                           "ppo-cartpole (with env.num_envs=2, ") and "(range " in line and "over 1 repeats)" in line


@pytest.mark.parametrize("setup, message", [
    ("corrupt", "not a reference-effects file: invalid JSON"),
    ("own-yaml", "--effects: records the figures of rlgauge's own trainers on a shipped preset"),
    ("folder", "is a directory, not a regular file"),
])
def test_ablate_effects_bad_target_exits_2_before_measuring(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                            setup: str, message: str) -> None:
    path, target = tmp_path / "effects.json", "ppo-cartpole"
    if setup == "corrupt":
        path.write_text("{not json", encoding="utf-8")
    elif setup == "folder":
        path.mkdir()
    else:
        target = str(tmp_path / "mine.yaml")
        Path(target).write_text((ROOT / "harness" / "specs" / "presets" / "ppo-cartpole.yaml").read_text(
            encoding="utf-8"), encoding="utf-8")
    code = main(["ablate", target, "--device", "cpu", "--flags", "batch_inference", "--out", str(tmp_path / "o"),
                 "--effects", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()  # refused before the output folder is made
