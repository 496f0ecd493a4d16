"""``rlgauge matrix``: every preset's variants, one Markdown + HTML report with charts."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import TINY
from harness.cli import main
from harness.analyses.matrix import PresetRow, matrix_specs, report_html, report_markdown
from harness.specs.presets import preset_names
from results_factory import make_result

VALUE_TINY = [f"{algo}.{key}={value}" for algo in ("dqn", "iqn")
              for key, value in (("learning_starts", 16), ("batch_size", 16), ("log_interval", 16))]
TINY_SETS = [a for item in [*TINY, *VALUE_TINY] for a in ("--set", item)]



def test_matrix_plans_both_variants_of_every_preset() -> None:
    plan = matrix_specs(None, ["device=cpu"])
    assert list(plan) == preset_names()
    assert all([s.variant for s in specs] == ["baseline", "optimized"] for specs in plan.values())


def test_report_has_a_row_per_preset_with_paired_speedup_and_stability() -> None:
    rows = [PresetRow("ppo-cartpole", [make_result("baseline", [100.0, 100.0, 100.0]),
                                       make_result("optimized", [300.0, 310.0, 290.0])]),
            PresetRow("dqn-cartpole", [make_result("baseline", [50.0], preset="dqn-cartpole"),
                                       make_result("optimized", [], preset="dqn-cartpole", status="failed",
                                                   error="RuntimeError: boom")])]
    text = report_markdown(rows)
    assert "| ppo-cartpole | ppo | 100 [100-100] | 300 [290-310] | 3.00x [2.90-3.10] |" in text
    assert "| dqn-cartpole |" in text and "- dqn-cartpole optimized: failed (RuntimeError: boom)" in text
    assert "![speedup per preset](matrix-speedup.png)" in text
    page = report_html(text)
    assert page.startswith("<!doctype html>") and "<table>" in page and '<img alt="speedup per preset"' in page


def test_matrix_tiny_run_writes_report_html_charts_and_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "mx"
    code = main(["matrix", "--presets", "ppo-cartpole,dqn-cartpole", *TINY_SETS, "--out", str(out), "--quiet"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "| ppo-cartpole | ppo |" in stdout and "| dqn-cartpole | dqn |" in stdout
    assert {p.name for p in out.iterdir()} >= {"report.md", "report.html", "matrix-speedup.png",
                                               "matrix-throughput.png", "runs.json"}
    assert "| ppo-cartpole | ppo |" in (out / "report.md").read_text(encoding="utf-8")
    assert (out / "matrix-speedup.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("argv, message", [
    (["--presets", "ppo-cartpol"], "--presets 'ppo-cartpol': unknown preset"),
    (["--presets", ","], "--presets: give at least one preset"),
    (["--steps", "0"], "run.steps: invalid value 0"),
])
def test_matrix_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                argv: list[str], message: str) -> None:
    code = main(["matrix", "--out", str(tmp_path / "mx"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "mx").exists()
