"""``harness.integrations.asv_helpers.trainer_benchmarks``: asv classes for a user's trainer."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from harness.integrations.asv_helpers import trainer_benchmarks
from test_own_trainer import BENCH, TOY

FAST = dict(steps=256, warmup_steps=64, repeats=3)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "toy_own.py").write_text(TOY)
    (tmp_path / "bench.yaml").write_text(BENCH)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("toy_own", None)
    yield tmp_path
    for name in [n for n in sys.modules if n == "toy_own" or n.startswith("userbench")]:
        del sys.modules[name]


def test_the_class_tracks_each_variants_speed_memory_and_cpu(project: Path) -> None:
    Speed = trainer_benchmarks("bench.yaml", name="ToySpeed", **FAST)
    assert Speed.__name__ == "ToySpeed" and Speed.params == [["baseline", "optimized"]]
    bench = Speed()
    cache = bench.setup_cache()
    for variant in ("baseline", "optimized"):
        rate = bench.track_env_steps_per_sec(cache, variant)
        assert rate > 0 and bench.track_seconds_per_1k_env_steps(cache, variant) == pytest.approx(1000 / rate)
        assert bench.track_cpu_seconds_per_1k_env_steps(cache, variant) > 0
        assert bench.track_peak_host_rss_mb(cache, variant) > 0
        assert math.isnan(bench.track_inference_latency_ms(cache, variant))  # a user's trainer: no policy to time
    assert Speed.track_env_steps_per_sec.unit == "env steps/s"


def test_a_preset_gets_its_latency_and_a_factory_its_own_file(project: Path) -> None:
    cache = trainer_benchmarks("ppo-cartpole", name="ToySpeed", variants=("optimized",), **FAST)().setup_cache()
    assert cache["optimized"]["inference_latency_ms"] > 0
    cache = trainer_benchmarks(trainer="toy_own:make_trainer", name="ToySpeed", config={"config": {"n": 16}},
                               variants=("config",),
                               **FAST)().setup_cache()
    assert cache["config"]["env_steps_per_sec"] > 0


def test_each_module_gets_its_own_asv_cache_and_a_second_class_is_refused(project: Path) -> None:
    package = project / "userbench"
    package.mkdir()
    (package / "__init__.py").write_text("")
    header = "from harness.integrations.asv_helpers import trainer_benchmarks\n"
    (package / "bench_a.py").write_text(header + "Speed = trainer_benchmarks('bench.yaml', name='Speed')\n")
    (package / "bench_b.py").write_text(header + "Speed = trainer_benchmarks('bench.yaml', name='Speed')\n"
                                        "Again = trainer_benchmarks('bench.yaml', name='Again')\n")
    import importlib

    sys.path.insert(0, str(project))  # the fixture restores sys.path
    a = importlib.import_module("userbench.bench_a")
    assert a.Speed.__module__ == "userbench.bench_a"
    assert get_setup_cache_key(a.Speed.setup_cache).startswith("bench_a:")  # asv's key: the module, not the helper
    with pytest.raises(ValueError, match="one class per module"):
        importlib.import_module("userbench.bench_b")
