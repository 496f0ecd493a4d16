"""The device comparison (``rlgauge run PRESET --device cpu,cuda``): the list is checked, each device
gets its own specs (``VARIANT@DEVICE``), and the table says which device is faster.

CUDA is faked where only its availability matters; the real run here is the CPU's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.console import Console

from conftest import TINY
from harness.measurement import runner
from harness.cli import main
from harness.analyses.devices import comparison_table, device_list, specs_on_devices, split_variant, verdict
from harness.errors import UserError
from harness.specs.presets import specs_for
from harness.measurement.runner import run_variants
from reference_trainers.runtime import device as dev
from results_factory import make_result


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA GPU with bf16 and TF32, as the device module sees it (nothing runs on it)."""
    monkeypatch.setattr(dev, "cuda_available", lambda: True)
    monkeypatch.setattr(dev, "mps_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dev, "supports_bf16", lambda device: True)
    monkeypatch.setattr(dev, "supports_tf32", lambda device: device.type == "cuda")
    monkeypatch.setattr(dev, "supports_fp16_autocast", lambda device: True)


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dev, "cuda_available", lambda: False)
    monkeypatch.setattr(dev, "mps_available", lambda: False)


def _text(table: object) -> str:
    console = Console(file=io.StringIO(), width=240)
    console.print(table)
    return console.file.getvalue()


def test_one_device_is_not_a_list() -> None:
    assert device_list(None) is None and device_list("cpu") is None and device_list("cuda:0") is None


def test_a_list_of_available_devices_is_taken_in_order(fake_cuda: None) -> None:
    assert device_list("cuda,cpu") == ["cuda", "cpu"]
    assert device_list(" cpu , cuda:0 ") == ["cpu", "cuda:0"]


@pytest.mark.parametrize("text, message", [
    ("cpu,cuda", "'cuda' is not available on this machine; available here: cpu"),
    ("cpu,mps", "'mps' is not available on this machine; available here: cpu"),
    ("cpu,,cuda", "an empty entry"),
    ("auto,cpu", "'auto' picks one of the devices"),
    ("cpu,cpu", "'cpu' is listed twice"),
    ("cpu,tpu", "'tpu' is not a device"),
    ("cpu,cuda:x", "'cuda:x' is not a device"),
])
def test_a_bad_device_list_is_one_user_error_naming_what_is_here(cpu_only: None, text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        device_list(text)


def test_a_cuda_index_beyond_the_gpus_here_is_refused(fake_cuda: None) -> None:
    with pytest.raises(UserError, match="'cuda:3' is not available on this machine; available here: cuda, cpu"):
        device_list("cpu,cuda:3")


def test_each_device_gets_its_own_specs_named_variant_at_device(fake_cuda: None) -> None:
    specs = specs_on_devices(["cpu", "cuda"], lambda d: specs_for("ppo-cartpole-gpu", "both", [f"device={d}"]))
    assert [s.variant for s in specs] == ["baseline@cpu", "optimized@cpu", "baseline@cuda", "optimized@cuda"]
    assert [s.config.device for s in specs] == ["cpu", "cpu", "cuda", "cuda"]
    by_name = {s.variant: s for s in specs}
    assert by_name["optimized@cuda"].config.optimizations.cuda_graphs is True  # the preset's on_device values
    assert by_name["optimized@cpu"].config.optimizations.cuda_graphs == "auto"
    assert split_variant("optimized@cuda:1") == ("optimized", "cuda:1") and split_variant("baseline") == ("baseline", None)


def test_the_table_says_which_device_is_faster_only_with_enough_repeats() -> None:
    cpu = make_result("optimized@cpu", [1000.0, 1100.0, 900.0])
    cuda = make_result("optimized@cuda", [4000.0, 4400.0, 3600.0], device="cuda")
    text = _text(comparison_table([cpu, cuda]))
    assert "optimized" in text and "cuda/cpu" in text and "4.00x [4.00-4.00]" in text and "cuda, 4.00x" in text
    slow = make_result("optimized@cuda", [250.0, 275.0, 225.0], device="cuda")
    assert "cpu, 4.00x" in _text(comparison_table([cpu, slow]))
    two = [make_result("optimized@cpu", [1000.0, 1000.0]), make_result("optimized@cuda", [2000.0, 2000.0])]
    assert "no verdict: 2 repeats (needs 3)" in _text(comparison_table(two))


def test_a_verdict_straddling_one_is_within_noise() -> None:
    from harness.stats.compare import Ratio

    assert verdict("cpu", "cuda", Ratio(1.01, 0.95, 1.08, "paired", 5)).startswith("within noise")
    assert verdict("cpu", "cuda", None) == "-"


def test_run_with_a_device_list_measures_each_device_and_prints_the_ratio(
        fake_cuda: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The CLI wiring: specs per device go to one interleaved run (faked here: nothing runs on CUDA)."""
    seen: list[tuple[str, str]] = []

    def fake_run(specs, **_kwargs):  # noqa: ANN001, ANN202 - run_variants' signature
        seen.extend((s.variant, s.config.device) for s in specs)
        rates = {"cpu": [1000.0, 1000.0, 1000.0], "cuda": [3000.0, 3000.0, 3000.0]}
        return [make_result(s.variant, rates[s.config.device], device=s.config.device) for s in specs], False

    monkeypatch.setattr(runner, "run_variants", fake_run)
    out = tmp_path / "devices.json"
    code = main(["run", "ppo-cartpole", "--variant", "optimized", "--device", "cpu,cuda", "--quiet", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0
    assert seen == [("optimized@cpu", "cpu"), ("optimized@cuda", "cuda")]
    assert "env steps/s by device" in stdout and "cuda, 3.00x" in stdout
    assert [r["variant"] for r in json.loads(out.read_text(encoding="utf-8"))["runs"]] == ["optimized@cpu",
                                                                                          "optimized@cuda"]


@pytest.mark.parametrize("argv", [
    ["run", "ppo-cartpole", "--device", "cpu,cuda"],
    ["run", "ppo-cartpole", "--device", "cpu,mps", "--peer", "sb3"],
    ["config", "ppo-cartpole", "--device", "cpu,cpu"],
    ["gate", "--run", "ppo-cartpole", "--device", "cpu,cuda"],
])
def test_device_list_bad_input_exits_2_with_one_line_and_writes_nothing(
        cpu_only: None, argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code = main([*argv, *(["--out", str(out)] if argv[0] in ("run", "gate") else [])])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("rlgauge: error: --device ") and err.count("\n") == 1
    assert not out.exists()


def test_peer_and_checkpoints_are_refused_with_a_device_list(fake_cuda: None, capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--peer", "sb3"], ["--checkpoint-every", "1000"]):
        assert main(["run", "ppo-cartpole", "--device", "cpu,cuda", *extra]) == 2
        assert "is not taken with a device list" in capsys.readouterr().err


def test_a_real_device_comparison_run_on_the_cpu_gives_a_row_per_variant() -> None:
    specs = specs_on_devices(["cpu"], lambda d: specs_for("ppo-cartpole", "both", [*TINY, f"device={d}",
                                                                                 "run.repeats=3"]))
    results, interrupted = run_variants(specs, say=lambda _text: None)
    assert interrupted is False
    assert [(r.variant, r.status, r.config["device"]) for r in results] == [("baseline@cpu", "ok", "cpu"),
                                                                          ("optimized@cpu", "ok", "cpu")]
    text = _text(comparison_table(results))
    assert "baseline" in text and "optimized" in text and "cpu" in text


def test_distributed_training_is_refused_with_a_device_list(
        fake_cuda: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29599")):
        monkeypatch.setenv(name, value)  # as torchrun sets them
    assert main(["run", "ppo-cartpole", "--device", "cpu,cuda", "--set", "distributed.enabled=true"]) == 2
    assert "a device comparison runs in one process" in capsys.readouterr().err
