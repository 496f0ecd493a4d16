"""Property tests over every parity class, outcome-changing flags included: no NaN/Inf, no float64 op."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.stats.parity import EXACT, FP_REORDER, OUTCOME, REDUCED_PRECISION
from parity_runs import ALGOS, assert_clean, train
from strategies import as_overrides, optimisation_combos

ALL_CLASSES = (EXACT, FP_REORDER, REDUCED_PRECISION, OUTCOME)


@pytest.mark.parametrize("algo", ALGOS)
@settings(max_examples=4)
@given(data=st.data(), seed=st.integers(min_value=0, max_value=3))
def test_any_flag_combination_trains_finite_and_float32(algo: str, data: st.DataObject, seed: int) -> None:
    """Vectorisation modes, action repeat, n-step, PER and every speed flag together: the run completes
    under the float64 sentinel with every statistic finite (outcome-class flags change the numbers,
    never their kind)."""
    combo = data.draw(optimisation_combos(algo=algo, classes=ALL_CLASSES))
    assert_clean(train(as_overrides(combo), seed=seed, algo=algo))
