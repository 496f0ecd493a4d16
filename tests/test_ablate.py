"""``rlgauge ablate``: which flags are found, the arms, the paired ratios and the outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import TINY
from harness.analyses.ablate import (ablation_json, arm_specs, flag_effects, markdown_table, parse_expectations, plan_ablation,
                            verdict, verdict_text)
from harness.cli import main
from harness.stats.compare import Ratio
from harness.specs.presets import specs_for
from harness.measurement.runner import rotated
from reference_trainers.config.resolve import resolve_config
from results_factory import make_result

CPU = ["device=cpu"]
CPU_FLAGS = {"env.vectorization", "batch_inference", "optimizer_impl", "foreach_grad_clip", "direct_adam_step", "sync_free_logging",
             "torch_threads", "lean_rollout", "stacked_mlps", "fused_gae", "packed_gather", "numpy_acting",
             "analytic_grads", "numpy_update", "block_noise"}



def test_flags_are_the_keys_the_variants_differ_in_that_the_device_honours() -> None:
    plan = plan_ablation("ppo-cartpole", CPU)
    assert {f.name for f in plan.flags} == CPU_FLAGS
    # auto flags that resolve to the plain value on CPU are listed, not run
    assert {"amp", "compile_model", "compile_train_step", "pinned_memory", "non_blocking", "tf32"} <= set(plan.not_applicable)
    assert "plain value False on cpu" in plan.not_applicable["amp"]
    assert not CPU_FLAGS & set(plan.not_applicable)


def test_arms_are_baseline_each_alone_all_on_and_leave_one_out() -> None:
    plan = plan_ablation("ppo-cartpole", CPU)
    names = [f.name for f in plan.flags]
    alone = [f.name for f in plan.flags if f.alone]
    assert list(plan.arms) == ["baseline", *(f"+{n}" for n in alone), "all-on", *(f"-{n}" for n in names)]
    # a flag that builds on another (the direct Adam kernel call on fused Adam) is measured in the stack only
    assert "direct_adam_step" in names and "direct_adam_step" not in alone
    assert plan.arms["+batch_inference"] == {"optimizations.batch_inference": True}
    assert "optimizations.torch_threads" not in plan.arms["-torch_threads"]
    assert len(plan.arms["-torch_threads"]) == len(names) - 1


def test_all_on_arm_is_the_optimized_variant_and_baseline_arm_the_baseline() -> None:
    plan = plan_ablation("ppo-cartpole", CPU)
    specs = {spec.variant: spec for spec in arm_specs(plan, "ppo-cartpole", CPU)}
    variants = {spec.variant: spec for spec in specs_for("ppo-cartpole", "both", CPU)}
    for arm, variant in (("all-on", "optimized"), ("baseline", "baseline")):
        assert resolve_config(specs[arm].config).config == resolve_config(variants[variant].config).config


def test_flags_option_keeps_only_the_named_flags_short_or_dotted() -> None:
    plan = plan_ablation("ppo-cartpole", CPU, ["optimizations.batch_inference", "torch_threads"])
    assert [f.name for f in plan.flags] == ["torch_threads", "batch_inference"]  # registry order
    assert list(plan.arms) == ["baseline", "+torch_threads", "+batch_inference", "all-on", "-torch_threads",
                               "-batch_inference"]
    assert plan.not_applicable == {}


def test_one_flag_has_no_leave_one_out_arms() -> None:
    plan = plan_ablation("ppo-cartpole", CPU, ["batch_inference"])
    assert list(plan.arms) == ["baseline", "+batch_inference"]


def _runs(samples: dict[str, list[float]]) -> list:
    return [make_result(arm, values) for arm, values in samples.items()]


def test_effects_are_paired_ratios_ranked_by_contribution_in_the_stack() -> None:
    plan = plan_ablation("ppo-cartpole", CPU, ["batch_inference", "torch_threads"])
    runs = _runs({
        "baseline": [100, 200, 100, 100, 100],
        "+batch_inference": [150, 300, 150, 150, 150],     # 1.5x in every repeat
        "+torch_threads": [101, 198, 100, 99, 102],        # noise
        "all-on": [300, 600, 300, 300, 300],
        "-batch_inference": [100, 200, 100, 100, 100],     # removing it loses 3x
        "-torch_threads": [290, 610, 300, 305, 300],       # removing it changes nothing
    })
    effects = flag_effects(plan, runs, {"batch_inference": 2.0})
    assert [e.name for e in effects] == ["batch_inference", "torch_threads"]
    first, second = effects
    assert first.alone.value == pytest.approx(1.5) and first.alone.low == pytest.approx(1.5)
    assert first.in_stack.value == pytest.approx(3.0)
    assert first.significant and verdict(first.alone) == "helps"
    assert not second.significant and verdict(second.in_stack) == "within noise"
    table = markdown_table(plan, runs, effects)
    assert "| 1 | `batch_inference` |" in table and "within noise (resolves +/-" in table
    assert "alone: helps (resolves +/-0.0 %); in stack: helps (resolves +/-0.0 %)" in table
    assert "2.00x" in table and "below expected" in table  # --expect column: expected 2x, measured 1.5x
    assert "95% percentile bootstrap" in table


def test_two_repeats_give_no_verdict_and_the_bracket_is_called_a_range() -> None:
    plan = plan_ablation("ppo-cartpole", CPU, ["batch_inference", "torch_threads"])
    runs = _runs({"baseline": [100, 100], "+batch_inference": [300, 310], "+torch_threads": [100, 101],
                  "all-on": [300, 300], "-batch_inference": [100, 100], "-torch_threads": [300, 301]})
    effects = flag_effects(plan, runs, {"batch_inference": 2.0})
    assert not any(e.significant for e in effects)
    table = markdown_table(plan, runs, effects)
    assert "alone: no verdict: 2 repeats (needs 3); in stack: no verdict: 2 repeats (needs 3)" in table
    assert "helps" not in table and "resolves" not in table.split("Whole stack")[0] and "bootstrap" not in table
    assert "2 repeats: the range (min-max) of the paired per-repeat ratios, not a confidence interval" in table
    data = ablation_json(plan, runs, effects)
    assert data["flags"][0]["verdict_alone"] == "no verdict: 2 repeats (needs 3)"
    assert data["flags"][0]["alone"]["resolution_pct"] is None and "range" in data["interval"]


def test_verdict_says_hurts_when_the_interval_is_below_one() -> None:
    assert verdict(Ratio(0.8, 0.7, 0.9, "paired", 5)) == "hurts"
    assert verdict(Ratio(1.2, 1.1, 1.3, "paired", 5)) == "helps"
    assert verdict(Ratio(1.0, 0.9, 1.3, "paired", 5)) == "within noise"
    assert verdict(None) == "n/a"
    assert verdict(Ratio(1.5, 1.5, 1.5, "paired", 1)) == "no verdict: 1 repeat (needs 3)"
    assert verdict(Ratio(1.5, 1.4, 1.6, "paired", 2)) == "no verdict: 2 repeats (needs 3)"
    assert verdict_text(Ratio(1.2, 1.1, 1.3, "paired", 3)) == "helps (resolves +/-8.3 %)"
    assert verdict_text(Ratio(1.2, 1.1, 1.3, "paired", 2)) == "no verdict: 2 repeats (needs 3)"


def test_rotation_puts_every_arm_in_every_slot() -> None:
    arms = ["a", "b", "c"]
    orders = [rotated(arms, r) for r in range(3)]
    assert orders == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    assert rotated(["x", "y"], 1) == ["y", "x"]


def test_expect_parses_speedups_and_rejects_unknown_flags() -> None:
    plan = plan_ablation("ppo-cartpole", CPU)
    assert parse_expectations("batch_inference=1.5x, torch_threads=2", plan) == {"batch_inference": 1.5,
                                                                               "torch_threads": 2.0}


@pytest.mark.parametrize("argv, message", [
    (["--flags", "warp_drive"], "--flags 'warp_drive': not a flag of ppo-cartpole"),
    (["--flags", ","], "--flags: give at least one flag"),
    (["--expect", "batch_inference=fast"], "expected FLAG=SPEEDUP"),
    (["--expect", "warp_drive=2x"], "--expect 'warp_drive': not a flag"),
    (["--set", "optimizations.warp=1"], "optimizations.warp: unknown key"),
])
def test_ablate_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                argv: list[str], message: str) -> None:
    code = main(["ablate", "ppo-cartpole", "--device", "cpu", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o" / "ablation.json").exists()


def test_ablate_unknown_preset_and_out_file_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["ablate", "ppo-cartpol"]) == 2
    assert "did you mean 'ppo-cartpole'" in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.write_text("keep me", encoding="utf-8")
    assert main(["ablate", "ppo-cartpole", "--device", "cpu", "--out", str(taken)]) == 2
    assert "is a file" in capsys.readouterr().err and taken.read_text(encoding="utf-8") == "keep me"


def test_ablate_plain_config_file_without_variants_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("algo: ppo\nenv: {id: CartPole-v1}\n", encoding="utf-8")
    assert main(["ablate", str(config)]) == 2
    assert "needs a preset with baseline and optimized variants" in capsys.readouterr().err


def test_ablate_tiny_run_writes_table_json_chart_and_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "abl"
    sets = [a for item in TINY for a in ("--set", item)]
    code = main(["ablate", "ppo-cartpole", *sets, "--flags", "batch_inference,sync_free_logging", "--repeats", "2",
                 "--expect", "batch_inference=1.5x", "--out", str(out), "--quiet"])
    stdout = capsys.readouterr().out
    assert code == 0
    assert "### Ablation: ppo-cartpole on cpu" in stdout and "expected (alone)" in stdout
    data = json.loads((out / "ablation.json").read_text(encoding="utf-8"))
    assert {f["name"] for f in data["flags"]} == {"batch_inference", "sync_free_logging"}
    assert set(data["arms"]) == {"baseline", "+batch_inference", "+sync_free_logging", "all-on", "-batch_inference",
                                 "-sync_free_logging"}
    assert all(len(arm["env_steps_per_sec"]["samples"]) == 2 for arm in data["arms"].values())
    # what a reference-effects entry needs: when, from which commit, and whether each arm was trustworthy
    assert data["started_at"][:4].isdigit() and "commit" in data["git"]
    assert all(isinstance(arm["quality"]["trustworthy"], bool) for arm in data["arms"].values())
    assert data["flags"][0]["alone"]["n"] == 2 and "not a confidence interval" in data["interval"]
    assert data["flags"][0]["verdict_alone"] == "no verdict: 2 repeats (needs 3)"
    assert (out / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(json.loads((out / "runs.json").read_text(encoding="utf-8"))["runs"]) == 6
