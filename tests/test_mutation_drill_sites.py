"""The mutation drill (tests/mutation_drill.py) plants each mutant by replacing one exact text: when code
moves, its site must move with it, or the drill stops at that mutant instead of running it."""

from __future__ import annotations

from pathlib import Path

import pytest

from mutation_drill import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_site_is_found_exactly_once(mutant) -> None:  # noqa: ANN001 - a Mutant
    text = (ROOT / mutant.path).read_text(encoding="utf-8")
    assert text.count(mutant.old) == 1, f"{mutant.name}: {mutant.path} has {text.count(mutant.old)} copies of its site"
    assert Path(ROOT / mutant.path).suffix == ".py"


def test_mutant_names_are_unique() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
