"""``rlgauge diagnose``: the environment report, phase shares, the env-only ceiling and the advice rules."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY
from harness.cli import main
from harness.analyses.diagnose import Facts, advise, env_ceiling, facts_from, phase_shares
from harness.measurement.environment import environment_lines, environment_report, try_compile
from harness.specs.presets import specs_for
from reference_trainers.config.resolve import resolve_config
from results_factory import make_result

TINY_SETS = [a for item in TINY for a in ("--set", item)]
PLAIN = {"batch_inference": False, "sync_free_logging": False, "torch_threads": None, "optimizer_impl": "forloop",
         "compile_model": False, "compile_train_step": False, "amp": False}



def facts(env=10.0, inference=10.0, update=10.0, transfer=0.0, logging=0.0, syncs=1.0, ceiling=None,
          device="cpu", vectorization="serial", util=None, compile_works=None, algo="ppo", body="mlp",
          **flags) -> Facts:
    shares = {"env": env, "inference": inference, "update": update, "transfer": transfer, "logging": logging}
    shares["other"] = 100 - sum(shares.values())
    config = {"device": device, "algo": algo, "model": {"body": body, "recurrent": "none"},
              "env": {"vectorization": vectorization}, "optimizations": {**PLAIN, **flags}}
    return Facts(shares, syncs, util, ceiling, config, compile_works)


def rules(f: Facts) -> list[str]:
    return [a["rule"] for a in advise(f)]


def test_env_bound_run_is_told_to_try_native_or_async() -> None:
    advice = advise(facts(env=70.0))
    assert [a["rule"] for a in advice] == ["env_bound"]
    assert "env.vectorization=native" in advice[0]["advice"] and "async" in advice[0]["advice"]
    assert rules(facts(env=70.0, vectorization="native")) == []


def test_many_host_syncs_suggest_only_the_flags_that_are_off() -> None:
    text = advise(facts(syncs=17.5))[0]["advice"]
    assert "batch_inference=true and sync_free_logging=true" in text
    text = advise(facts(syncs=3.0, batch_inference=True))[0]["advice"]
    assert "sync_free_logging=true" in text and "batch_inference" not in text
    assert rules(facts(syncs=2.0)) == []


def test_update_dominant_advice_depends_on_the_device() -> None:
    cpu = advise(facts(update=80.0))[0]["advice"]
    assert "torch_threads=1" in cpu and "optimizer_impl=fused" in cpu
    gpu = advise(facts(update=80.0, device="cuda:0"))[0]["advice"]
    assert "bigger batches" in gpu and "compile_train_step=true" in gpu and "amp=true" in gpu
    done = advise(facts(update=80.0, torch_threads=1, optimizer_impl="fused"))[0]["advice"]
    assert "torch_threads" not in done and "fused" not in done


def test_cpu_update_advice_points_to_the_hand_written_step() -> None:
    plain = advise(facts(update=80.0))[0]["advice"]
    assert "analytic_grads=true" in plain
    assert "analytic_grads" not in advise(facts(update=80.0, algo="iqn"))[0]["advice"]
    analytic = advise(facts(update=80.0, analytic_grads=True))[0]["advice"]
    assert "numpy_update=true" in analytic and "compile_train_step=true" in analytic
    assert "analytic_grads=true" not in analytic
    for done in (advise(facts(update=80.0, analytic_grads=True, compile_train_step=True))[0]["advice"],
                 advise(facts(update=80.0, analytic_grads=True, numpy_update=True))[0]["advice"]):
        assert "compile_train_step" not in done and "numpy_update" not in done


def test_torch_acting_on_the_cpu_suggests_numpy_acting() -> None:
    assert rules(facts(inference=30.0, batch_inference=True)) == ["torch_acting"]
    assert "numpy_acting=true" in advise(facts(inference=30.0, batch_inference=True))[0]["advice"]
    assert rules(facts(inference=30.0, batch_inference=True, numpy_acting=True)) == []
    assert rules(facts(inference=30.0, batch_inference=True, body="cnn")) == []
    assert rules(facts(inference=30.0, batch_inference=True, device="cuda:0")) == []


def test_remaining_rules_fire_on_their_measurements() -> None:
    assert rules(facts(inference=40.0)) == ["per_env_inference"]
    assert rules(facts(transfer=20.0)) == ["transfer"]
    assert rules(facts(logging=20.0)) == ["logging"]
    assert rules(facts(logging=20.0, sync_free_logging=True)) == []
    assert rules(facts(ceiling=0.8)) == ["near_env_ceiling"]
    assert rules(facts(device="cuda:0", util=10.0)) == ["gpu_idle"]
    assert rules(facts(compile_works=False, compile_model=True)) == ["compile_broken"]
    assert rules(facts()) == []


def test_phase_shares_are_percent_of_timed_wall_time() -> None:
    run = make_result("baseline", [1000.0, 1000.0], steps_completed=2000)  # 2 s timed
    shares = phase_shares(run)  # results_factory: env/inference/update 0.1 s each
    assert shares["env"] == pytest.approx(5.0) and shares["update"] == pytest.approx(5.0)
    assert shares["other"] == pytest.approx(85.0)


def test_env_ceiling_steps_the_resolved_backend_on_random_actions() -> None:
    (spec,) = specs_for("ppo-cartpole", "optimized", ["device=cpu", "env.num_envs=8"])
    config = resolve_config(spec.config).config
    assert config.env.vectorization == "native"
    assert env_ceiling(config, 400) > 0


def test_compile_trial_that_runs_too_long_is_reported_not_raised() -> None:
    result = try_compile("cpu", timeout_s=0.01)
    assert result["works"] is False and "did not finish within" in result["error"]


def test_environment_report_names_torch_threads_and_devices() -> None:
    report = environment_report(check_compile=False)
    assert report["torch"] == torch.__version__ and "cpu" in report["devices"]
    assert report["cuda"]["available"] == torch.cuda.is_available()
    lines = "\n".join(environment_lines(report))
    assert "torch threads" in lines and "MPS:" in lines and "CUDA" in lines


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_environment_report_describes_each_cuda_device() -> None:
    report = environment_report(check_compile=False)
    assert report["cuda"]["devices"] and {"name", "capability", "bf16", "tf32"} <= set(report["cuda"]["devices"][0])


def test_diagnose_json_is_one_object_with_profile_ceiling_and_advice(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "ppo-cartpole", *TINY_SETS, "--json", "--no-compile-check"])
    out = capsys.readouterr().out
    assert code == 0
    data = json.loads(out)
    d = data["diagnosis"]
    assert data["environment"]["torch"] == torch.__version__
    assert set(d["phases"]) == {"env", "inference", "update", "transfer", "other"}
    assert set(d["probe_phases"]) == {"env", "inference", "update", "transfer", "logging", "other"}
    assert sum(d["phases"].values()) == pytest.approx(100.0, abs=0.5)
    assert d["variant"] == "baseline" and d["env_ceiling_steps_per_sec"] > 0 and 0 < d["fraction_of_ceiling"]
    assert {"host_syncs", "float64", "forwards_per_env_step", "recommendations"} <= set(d)
    assert d["forwards_per_env_step"] >= 0.9  # the baseline's per-env forwards
    assert "per_env_inference" in [r["rule"] for r in d["recommendations"]]
    assert "host_syncs" in [a["rule"] for a in d["flag_advice"]]


def test_diagnose_text_shows_breakdown_and_ceiling(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diagnose", "ppo-cartpole", *TINY_SETS, "--variant", "optimized", "--no-compile-check"])
    out = capsys.readouterr().out
    assert code == 0
    assert "## Environment" in out and "phases found by the hooks" in out and "phases the trainer reports" in out
    assert "env-only ceiling" in out and "recommendations" in out


@pytest.mark.parametrize("argv, message", [
    (["ppo-cartpol"], "unknown preset 'ppo-cartpol'"),
    (["ppo-cartpole", "--variant", "fast"], "--variant fast: ppo-cartpole has no such variant"),
    (["ppo-cartpole", "--steps", "many"], "invalid int value: 'many'"),
    (["ppo-cartpole", "--set", "env.num_envs=-1"], "env.num_envs: invalid value -1"),
])
def test_diagnose_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code = main(["diagnose", *argv, "--no-compile-check"])
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err and len(captured.err.strip().splitlines()) == 1
    assert captured.out == ""


def _cuda_run(num_envs: int, device: str = "cuda:0"):  # noqa: ANN202 - a RunResult
    run = make_result("optimized", device=device)
    run.config.update({"algo": "ppo", "env": {"id": "CartPole-v1", "num_envs": num_envs, "vectorization": "native"},
                       "model": {"body": "mlp", "recurrent": "none"},
                       "optimizations": {**PLAIN, "batch_inference": True, "sync_free_logging": True}})
    return run


def test_a_cuda_run_with_few_envs_is_latency_bound_and_told_to_measure_the_cpu_beside_it() -> None:
    advice = {a["rule"]: a["advice"] for a in advise(facts_from(_cuda_run(16), None, None))}
    assert "latency_bound" in advice
    text = advice["latency_bound"]
    assert "16 envs on cuda:0" in text and "latency-bound at this batch size" in text
    assert "`rlgauge run ppo-cartpole --device cpu,cuda:0`" in text and "not the fastest device" in text
    assert "latency_bound" not in rules(facts_from(_cuda_run(2048), None, None))  # a GPU-scale batch
    assert "latency_bound" not in rules(facts_from(_cuda_run(16, device="cpu"), None, None))
