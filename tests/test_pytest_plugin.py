"""The ``rlgauge`` pytest fixture, run inside a user's own test suite (pytester)."""

from __future__ import annotations

import json
import textwrap

import pytest

from test_own_trainer import BENCH, TOY

pytest_plugins = ["pytester"]

USER_TESTS = textwrap.dedent('''
    RUN = dict(steps=256, repeats=3, sets=("run.warmup_steps=64",), allow_untrustworthy=True)

    def test_speedup_passes(rlgauge):
        from harness import Outcome

        verdict = rlgauge.assert_speedup("bench.yaml", min_speedup=0.01, **RUN)
        assert verdict.outcome is Outcome.PASS and verdict.exit_code == 0 and "gate passed" in verdict.output

    def test_speedup_fails(rlgauge):
        rlgauge.assert_speedup("bench.yaml", min_speedup=1000, **RUN)

    def test_too_few_repeats_is_no_verdict(rlgauge):
        rlgauge.assert_speedup("bench.yaml", min_speedup=0.01, steps=256, repeats=2)

    def test_a_factory_and_its_config(rlgauge):
        rlgauge.assert_speedup(trainer="toy_own:make_trainer", min_speedup=0.01,
                               config={"config": {"n": 32}, "variants": {"baseline": {}, "optimized": {"n": 64}}},
                               **RUN)

    def test_bad_input_fails_with_its_line(rlgauge):
        rlgauge.assert_speedup("bench.yaml", min_speedup=1, sets=("run.stepz=1",))

    def test_regression_against_a_saved_result(rlgauge):
        rlgauge.assert_no_regression("bench.yaml", baseline="saved.json", max_slowdown_pct=99, steps=256, repeats=3,
                                     sets=("run.warmup_steps=64",), allow_untrustworthy=True)
''')


@pytest.fixture
def user_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makepyfile(toy_own=TOY, test_speed=USER_TESTS)
    pytester.path.joinpath("bench.yaml").write_text(BENCH)
    monkeypatch.syspath_prepend(str(pytester.path))
    return pytester


def test_the_fixture_gives_gate_verdicts_as_test_outcomes(user_suite: pytest.Pytester) -> None:
    from harness.cli import main

    assert main(["run", "bench.yaml", "--variant", "optimized", "--out", "saved.json", "--quiet", "--steps", "256",
                 "--repeats", "3", "--set", "run.warmup_steps=64"]) == 0
    assert json.loads((user_suite.path / "saved.json").read_text())["runs"][0]["variant"] == "optimized"
    result = user_suite.runpytest_inprocess("-p", "no:cacheprovider", "-rs")  # the plugin: its entry point
    result.assert_outcomes(passed=3, failed=2, skipped=1)
    text = result.stdout.str()
    assert "gate failed" in text or "FAIL" in text
    assert "no verdict: 2 repeats (needs 3)" in text
    assert "run.stepz: unknown key" in text
    # the summary names the speed test that could not decide, apart from ordinary skips
    assert "rlgauge: speed gates without a verdict" in text
    assert "NO VERDICT test_speed.py::test_too_few_repeats_is_no_verdict" in text


def test_the_plugin_is_registered_for_users_through_its_entry_point() -> None:
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="pytest11") if e.name == "rlgauge"] == ["harness.integrations.pytest_plugin"]
