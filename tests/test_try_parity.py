"""``rlgauge try``'s parity cannot be fooled: NaN is never "identical", buffers, target networks and optimizer state
are compared as well as parameters, and the modules are found whatever ids they got (docs/try.md)."""

from __future__ import annotations

import gc
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from harness.trials import parity
from harness.trials.processes.arms import Arm, ArmRunner, Target
from harness.trials.processes.child import trainer_state
from harness.trials.runtime_patches import ModuleRecorder, trial_factory

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

import try_parity_trainer  # noqa: E402


def _state(final: dict[str, list[float]], initial: dict[str, list[float]] | None = None) -> dict[str, Any]:
    as_tensors = lambda d: {k: torch.tensor(v) for k, v in d.items()}  # noqa: E731
    return {"final": as_tensors(final), "initial": as_tensors(initial or {k: [0.0] * len(v) for k, v in final.items()})}


def test_nan_where_the_unchanged_trainer_is_finite_changes_the_maths() -> None:
    nan = float("nan")
    found = parity.compare(_state({"w": [0.1, 0.2, 0.3]}), _state({"w": [nan, nan, nan]}))
    assert found.value == math.inf and found.where == "w" and "3 NaN/Inf values in w" in found.note
    judged = parity.classify(found, 0.0)
    assert judged.cls == parity.CHANGES and not judged.keeps_maths and "NaN/Inf" in judged.note
    assert judged.to_dict()["max_rel_diff"] is None  # JSON without Infinity


def test_a_changed_count_of_nonfinite_values_changes_the_maths() -> None:
    nan, inf = float("nan"), float("inf")
    reference = _state({"w": [nan, 0.2, 0.3]})
    assert parity.classify(parity.compare(reference, _state({"w": [nan, nan, 0.3]})), 0.0).cls == parity.CHANGES
    assert parity.classify(parity.compare(reference, _state({"w": [0.1, 0.2, 0.3]})), 0.0).cls == parity.CHANGES
    assert parity.classify(parity.compare(reference, _state({"w": [inf, 0.2, 0.3]})), 0.0).cls == parity.CHANGES


def test_nan_against_nan_at_the_same_places_stays_comparable() -> None:
    nan = float("nan")
    reference = _state({"w": [nan, 0.2, 0.3]}, {"w": [0.0, 0.0, 0.0]})
    assert parity.classify(parity.compare(reference, _state({"w": [nan, 0.2, 0.3]})), 0.0).cls == parity.IDENTICAL
    close = parity.classify(parity.compare(reference, _state({"w": [nan, 0.2, 0.3 + 1e-7]})), 0.0)
    assert close.cls == parity.WITHIN and 0 < close.max_rel_diff < parity.TOLERANCE
    far = parity.classify(parity.compare(reference, _state({"w": [nan, 0.2, 0.4]})), 0.0)
    assert far.cls == parity.CHANGES and far.max_rel_diff == pytest.approx(1 / 3)


def test_a_nonfinite_unchanged_noise_is_not_reproducible() -> None:
    assert parity.classify(parity.Difference(0.0), float("nan")).cls == parity.NOT_REPRODUCIBLE


def _one_call(monkeypatch: pytest.MonkeyPatch, breaks: str, changed: bool) -> dict[str, Any]:
    """One ``iterate()`` of the parity trainer, recorded as the child records it; ``changed``: distribution checks
    off, which is what breaks it."""
    monkeypatch.setattr(torch.distributions.Distribution, "_validate_args", not changed)
    optimizers: list[Any] = []
    handle = register_optimizer_step_post_hook(lambda o, *_: optimizers.append(o))
    try:
        trainer = trial_factory(try_parity_trainer.make_trainer, [])({"break_without_checks": breaks}, device="cpu",
                                                                     seed=1)
        initial = trainer_state(trainer.modules, [])
        trainer.iterate()
        return {"initial": initial, "final": trainer_state(trainer.modules, optimizers[:1])}
    finally:
        handle.remove()


@pytest.mark.parametrize(("breaks", "where"), [("normaliser", "2.Normaliser.buffer:mean"),
                                               ("target", "1.Sequential.2.bias"),
                                               ("optimizer", "optimizer0.Adam.state.0.exp_avg_sq")])
def test_buffers_target_networks_and_optimizer_state_are_compared(monkeypatch: pytest.MonkeyPatch, breaks: str,
                                                                  where: str) -> None:
    """Each differs alone after one call: a buffers-only normaliser, a target network made by copy.deepcopy, Adam's
    second moment."""
    reference = _one_call(monkeypatch, breaks, changed=False)
    assert parity.compare(reference, _one_call(monkeypatch, breaks, changed=False)).value == 0.0
    found = parity.compare(reference, _one_call(monkeypatch, breaks, changed=True))
    assert found.where == where and found.value > parity.TOLERANCE
    assert parity.classify(found, 0.0).cls == parity.CHANGES


def test_the_recorder_finds_deepcopies_and_buffer_only_modules() -> None:
    recorder = ModuleRecorder()
    setstate = nn.Module.__setstate__
    with recorder:
        q = nn.Sequential(nn.Linear(2, 2))
        target = __import__("copy").deepcopy(q)
        norm = try_parity_trainer.Normaliser(2)
    assert recorder.top_level() == [q, target, norm]
    assert nn.Module.__setstate__ is setstate  # put back on exit


def test_the_recorder_keeps_a_module_built_where_a_dead_one_was() -> None:
    """A module whose id was a dead module's (CPython reuses addresses) is recorded, not taken for the dead one."""
    recorder = ModuleRecorder()
    with recorder:
        for _ in range(50):
            nn.Linear(2, 2)  # dies at once: its address is free for the next
            gc.collect()
        kept = nn.Linear(2, 2)
    assert recorder.top_level() == [kept]


# --------------------------------------------------------------------------- in the arms' processes

YAML = """\
trainer: try_parity_nan:make_trainer
config: {break_without_checks: nan}
run: {steps: 64, warmup_steps: 32, repeats: 2}
"""


def test_a_change_that_turns_parameters_into_nan_changes_the_maths(tmp_path: Path) -> None:
    """The unchanged trainer twice and ``no_validate_args`` (which makes this trainer's weights NaN), each in an arm's
    process, compared as ``try`` compares them."""
    shutil.copy(TESTS / "try_parity_trainer.py", tmp_path / "try_parity_nan.py")
    (tmp_path / "nan.yaml").write_text(YAML)
    runner = ArmRunner(Target(str(tmp_path / "nan.yaml"), None, None, "baseline", [], [str(tmp_path), *sys.path],
                              fair_threads=False), tmp_path)
    first, second = (runner.run(Arm("unchanged"), "parity", 3) for _ in range(2))
    changed = runner.run(Arm("no_validate_args", ("no_validate_args",), ("no_validate_args",)), "parity", 3)
    assert "error" not in changed, changed
    assert changed["parity"]["nonfinite"] > 0 and first["parity"]["nonfinite"] == 0
    assert first["parity"]["modules"] == ["Sequential", "Sequential", "Normaliser"]
    assert first["parity"]["optimizer_classes"] == ["Adam"]
    noise = parity.compare(parity.load(first["params"]), parity.load(second["params"])).value
    assert noise == 0.0
    judged = parity.classify(parity.compare(parity.load(first["params"]), parity.load(changed["params"])), noise)
    assert judged.cls == parity.CHANGES and "NaN/Inf values in 0.Sequential.0.weight" in judged.note
