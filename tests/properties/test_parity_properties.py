"""Property tests: optimisation combinations keep the numbers their parity class promises."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.parity import EXACT, FP_REORDER, REDUCED_PRECISION, combined_class
from parity_runs import ALGOS, PIXEL_ALGOS, SEVERAL_UPDATES, assert_clean, assert_parity, reference, train
from strategies import as_overrides, optimisation_combos, parity_settings

SEEDS = st.integers(min_value=0, max_value=3)
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
    pytest.param("mps", marks=pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs MPS")),
]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), seed=SEEDS)
def test_exact_flags_match_the_plain_reference(algo: str, device: str, data: st.DataObject, seed: int) -> None:
    combo = data.draw(optimisation_combos(algo=algo, device=device, classes=(EXACT,)))
    outcome = train(as_overrides(combo), seed=seed, device=device, algo=algo)
    assert_clean(outcome)
    assert_parity(outcome, reference(seed, device, algo=algo), EXACT)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data(), seed=SEEDS)
def test_fp_reorder_flags_stay_within_reassociation_error(algo: str, device: str, data: st.DataObject, seed: int) -> None:
    combo = data.draw(optimisation_combos(algo=algo, device=device, classes=(EXACT, FP_REORDER)))
    outcome = train(as_overrides(combo), seed=seed, device=device, algo=algo)
    assert_clean(outcome)
    assert_parity(outcome, reference(seed, device, algo=algo), combined_class(parity_settings(combo)))


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=10)
@given(data=st.data(), seed=SEEDS)
def test_reduced_precision_tracks_float32_over_several_updates(algo: str, device: str, data: st.DataObject,
                                                               seed: int) -> None:
    """Finite, and over several updates the parameter change and the losses follow float32's
    (``harness.parity.REDUCED_PRECISION_BOUNDS``); combinations without a reduced-precision flag
    are the other tests' business. Ten examples, fewer than the other classes, keep the suite's
    time now that each trains two iterations (6 to 13 updates) rather than one update."""
    combo = data.draw(optimisation_combos(algo=algo, device=device, classes=(EXACT, FP_REORDER, REDUCED_PRECISION)))
    parity_class = combined_class(parity_settings(combo))
    assume(parity_class == REDUCED_PRECISION)
    outcome = train(as_overrides(combo) + SEVERAL_UPDATES[algo], seed=seed, device=device, algo=algo)
    assert_clean(outcome)
    assert_parity(outcome, reference(seed, device, several_updates=True, algo=algo), parity_class)


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=2)
@given(data=st.data(), seed=SEEDS)
def test_compiled_combinations_stay_within_reassociation_error(device: str, data: st.DataObject, seed: int) -> None:
    """Compilation is slow, so few examples; never none. Inductor's kernels reassociate float ops.

    Parity runs the compiled code for real (no dispatch mode, which would make it eager);
    the float64 check then runs the same combination under the sentinel (eagerly).
    """
    combo = data.draw(optimisation_combos(device=device, classes=(EXACT, FP_REORDER), compile_flags=True))
    torch._dynamo.reset()
    compiled = train(as_overrides(combo), seed=seed, device=device, watch_float64=False)
    assert not compiled.compile_fallback
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    assert_parity(compiled, reference(seed, device), combined_class(parity_settings(combo)))
    assert_clean(train(as_overrides(combo), seed=seed, device=device))


IQN_COMPILED_DRIFTS = pytest.mark.xfail(
    reason="IQN's compiled update drifted from eager with torch 2.11 (H100: parameters 3e-3 apart after a dozen "
           "updates, on CUDA and on the CPU; torch 2.13 on the CPU stays within reassociation error); "
           "compile_train_step: auto keeps IQN eager on CUDA", strict=False)


@pytest.mark.parametrize("algo", ["dqn", "iqn"])
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_value_based_train_step_stays_within_reassociation_error(request: pytest.FixtureRequest, algo: str,
                                                                         device: str) -> None:
    """The compiled update of DQN and IQN (replay, targets, the pairwise quantile loss) does eager's maths."""
    if algo == "iqn" and (device == "cuda" or torch.torch_version.TorchVersion(torch.__version__) < (2, 13)):
        request.applymarker(IQN_COMPILED_DRIFTS)
    torch._dynamo.reset()
    compiled = train(["optimizations.compile_train_step=true"], seed=0, device=device, algo=algo, watch_float64=False)
    assert not compiled.compile_fallback
    assert_parity(compiled, reference(0, device, algo=algo), FP_REORDER)


@pytest.mark.parametrize("algo", PIXEL_ALGOS)
@settings(max_examples=4)
@given(data=st.data(), seed=SEEDS)
def test_pixel_exact_flags_match_the_plain_reference(algo: str, data: st.DataObject, seed: int) -> None:
    """The CNN body, uint8 frames, uint8_transfer and num_workers keep exact parity on a tiny image env."""
    combo = data.draw(optimisation_combos(algo=algo, classes=(EXACT,), pixels=True))
    outcome = train(as_overrides(combo), seed=seed, algo=algo, pixels=True)
    assert_clean(outcome)
    assert_parity(outcome, reference(seed, algo=algo, pixels=True), EXACT)


@pytest.mark.parametrize("algo", PIXEL_ALGOS)
@settings(max_examples=3)
@given(data=st.data(), seed=SEEDS)
def test_pixel_reduced_precision_tracks_float32_over_several_updates(algo: str, data: st.DataObject,
                                                                     seed: int) -> None:
    combo = data.draw(optimisation_combos(algo=algo, classes=(EXACT, FP_REORDER, REDUCED_PRECISION), pixels=True))
    parity_class = combined_class(parity_settings(combo))
    assume(parity_class == REDUCED_PRECISION)
    outcome = train(as_overrides(combo) + SEVERAL_UPDATES[algo], seed=seed, algo=algo, pixels=True)
    assert_clean(outcome)
    assert_parity(outcome, reference(seed, several_updates=True, algo=algo, pixels=True), parity_class)
