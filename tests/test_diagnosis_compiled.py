"""``rlgauge diagnose`` on a compiled trainer: nothing of rlgauge's inside the compiled region, the update
found by what the compiled call does, the acting call at the loop's line, the breaks as the trainer has them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.cli import main

TESTS = Path(__file__).parent
YAML = """\
trainer: compiled_trainer:make_trainer
config: {num_steps: 16}
variants: {baseline: {}}
run: {steps: 256, warmup_steps: 64, repeats: 1}
"""


@pytest.fixture()
def compiled_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(TESTS))
    path = tmp_path / "compiled.yaml"
    path.write_text(YAML)
    return path


def _line(text: str) -> int:
    lines = (TESTS / "compiled_trainer.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_compiled_trainer_is_diagnosed_without_recompiles_of_rlgauges_making(
        compiled_yaml: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch._dynamo

    torch._dynamo.reset()
    code = main(["diagnose", str(compiled_yaml), "--json", "--device", "cpu"])
    d = json.loads(capsys.readouterr().out)["diagnosis"]
    assert code == 0
    loop = d["loop"]
    assert loop["recompiles"] == 0 and loop["recompile_reasons"] == []
    assert loop["hooks_kept_installed"] is True
    assert loop["compiled_calls"]["update"] > 0 and loop["compiled_calls"]["forward"] > 0
    assert loop["optimizer_steps_per_env_step"] == pytest.approx(1 / 32)
    assert loop["optimizers"] == [{"class": "Adam", "impl": "compiled"}]
    assert d["inference_forward_sites"][0].endswith(f"compiled_trainer.py:{_line('action = policy(obs)')}")
    breaks = {(s["kind"], s["where"].rpartition("compiled_trainer.py:")[2]) for s in loop["graph_break_sites"]}
    assert ("optimizer.zero_grad()", str(_line("optimizer.zero_grad()"))) in breaks
    assert ("backward()", str(_line("loss.backward()"))) in breaks
    assert not any("harness" in s["where"] for s in loop["graph_break_sites"])
    assert d["phases"]["update"] > 0 and d["forwards_per_env_step"] == pytest.approx(0.5)
    assert not any(r["rule"] == "forloop_optimizer" for r in d["recommendations"])
