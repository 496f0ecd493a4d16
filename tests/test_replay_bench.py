"""Replay micro-benchmarks (harness/analyses/replay_bench.py): every cell measured, rates positive and
well formed, the buffers really full, and the command line's table and JSON."""

from __future__ import annotations

import json

import pytest

from harness.analyses.replay_bench import filled_buffer, format_table, main, measure_replay


def test_measure_replay_gives_every_cell_with_positive_rates() -> None:
    results = measure_replay(("list", "tensor"), (64, 300), (8, 32), repeats=2, min_seconds=0.005)
    assert [(r.kind, r.capacity, r.batch_size) for r in results] == [
        ("list", 64, 8), ("list", 64, 32), ("tensor", 64, 8), ("tensor", 64, 32),
        ("list", 300, 8), ("list", 300, 32), ("tensor", 300, 8), ("tensor", 300, 32)]
    for r in results:
        for rates in (r.insert_transitions_per_sec, r.sample_batches_per_sec):
            assert len(rates["samples"]) == 2 and 0 < rates["min"] <= rates["median"] <= rates["max"]


@pytest.mark.parametrize("kind", ["list", "tensor"])
def test_benchmarked_buffers_are_filled_to_capacity(kind: str) -> None:
    import torch

    buffer = filled_buffer(kind, 1000, 4, torch.device("cpu"), chunk=300)
    assert len(buffer) == 1000 and buffer.position == 0
    assert buffer.sample(16).obs.shape == (16, 4)


def test_table_shows_the_tensor_over_list_sampling_ratio() -> None:
    table = format_table(measure_replay(("list", "tensor"), (128,), (16,), repeats=1, min_seconds=0.005))
    lines = table.splitlines()
    assert len(lines) == 3 and "sample ratio" in lines[0]
    assert lines[2].split()[0] == "tensor" and lines[2].endswith("x")


def test_command_line_prints_a_table_or_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--capacities", "50", "--batch-sizes", "4", "--repeats", "1", "--min-seconds", "0.005"]
    assert main(args) == 0
    assert "insert transitions/s" in capsys.readouterr().out
    assert main(args + ["--kinds", "tensor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["kind"] for d in data] == ["tensor"] and data[0]["capacity"] == 50
    with pytest.raises(SystemExit) as info:
        main(["--kinds", "deque"])
    assert info.value.code == 2
