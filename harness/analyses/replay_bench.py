"""Replay micro-benchmarks: insert and sample rates of the list and tensor replay storages.

``measure_replay(...)`` is what the asv suite (or anything else) calls; ``python -m
harness.analyses.replay_bench`` prints a table. Each cell fills a buffer of the given capacity to
the brim, then times inserts of ``rows_per_insert`` transitions (one vector-env step of
that many sub-envs) and uniform minibatches of ``batch_size`` (on the device, copies
included), each over ``repeats`` windows of at least ``min_seconds``; rates are medians
with their min-max (``metrics.spread``). Inputs are seeded, so runs are comparable.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from reference_trainers import HostToDevice, ReplayBuffer, TransitionBatch, make_replay
from reference_trainers.runtime import device as dev

from harness.measurement import metrics

KINDS = ("list", "tensor")
CAPACITIES = (10_000, 100_000, 1_000_000)
BATCH_SIZES = (32, 256)


@dataclass(frozen=True)
class ReplayRates:
    """One cell: rates are medians over the timed windows (with min and max)."""

    kind: str
    capacity: int
    batch_size: int
    insert_transitions_per_sec: dict[str, float | list[float]]
    sample_batches_per_sec: dict[str, float | list[float]]


def random_transitions(rows: int, obs_dim: int, rng: np.random.Generator, num_actions: int = 4) -> TransitionBatch:
    """Seeded float32 transitions (int64 actions), shaped as a writer emits them."""
    return TransitionBatch(rng.standard_normal((rows, obs_dim), dtype=np.float32),
                           rng.integers(0, num_actions, rows, dtype=np.int64),
                           rng.standard_normal(rows, dtype=np.float32),
                           rng.standard_normal((rows, obs_dim), dtype=np.float32),
                           np.full(rows, 0.99, dtype=np.float32))


def filled_buffer(kind: str, capacity: int, obs_dim: int, device: torch.device, seed: int = 0,
                  chunk: int = 8192) -> ReplayBuffer:
    """A uniform replay buffer of ``kind`` holding ``capacity`` seeded transitions."""
    generator = torch.Generator(device=device).manual_seed(seed)
    buffer = make_replay(kind, capacity, obs_dim, device, HostToDevice(device), generator)
    rng = np.random.default_rng(seed)
    while len(buffer) < capacity:
        buffer.add(random_transitions(min(chunk, capacity - len(buffer)), obs_dim, rng))
    return buffer


def _rate(work: Callable[[], None], units: float, device: torch.device, repeats: int, min_seconds: float
          ) -> dict[str, float | list[float]]:
    """``units`` per second of ``work()``, over ``repeats`` windows of at least ``min_seconds``."""
    work()  # warm-up: first-touch allocations, kernel selection
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while True:
            work()
            calls += 1
            dev.synchronize(device)
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(calls * units / elapsed)
    return metrics.spread(rates)


def measure_replay(kinds: tuple[str, ...] = KINDS, capacities: tuple[int, ...] = CAPACITIES,
                   batch_sizes: tuple[int, ...] = BATCH_SIZES, *, obs_dim: int = 4, rows_per_insert: int = 8,
                   device: str = "cpu", repeats: int = 3, min_seconds: float = 0.2) -> list[ReplayRates]:
    """Insert and sample rates for every (kind, capacity, batch size) cell."""
    target = dev.resolve_device(device)
    results = []
    for capacity in capacities:
        for kind in kinds:
            buffer = filled_buffer(kind, capacity, obs_dim, target)
            rows = random_transitions(rows_per_insert, obs_dim, np.random.default_rng(1))
            inserts = _rate(lambda: buffer.add(rows), rows_per_insert, target, repeats, min_seconds)
            for batch_size in batch_sizes:
                samples = _rate(lambda: buffer.sample(batch_size), 1, target, repeats, min_seconds)
                results.append(ReplayRates(kind, capacity, batch_size, inserts, samples))
    return results


def format_table(results: list[ReplayRates]) -> str:
    """A plain-text table, with the tensor/list ratio where both kinds were measured."""
    median = lambda rates: float(rates["median"])  # noqa: E731
    by_key = {(r.kind, r.capacity, r.batch_size): r for r in results}
    lines = [f"{'kind':<7}{'capacity':>10}{'batch':>7}{'insert transitions/s':>22}{'sample batches/s':>18}"
             f"{'sample ratio':>14}"]
    for r in results:
        ratio = ""
        base = by_key.get(("list", r.capacity, r.batch_size))
        if r.kind == "tensor" and base is not None:
            ratio = f"{median(r.sample_batches_per_sec) / median(base.sample_batches_per_sec):.1f}x"
        lines.append(f"{r.kind:<7}{r.capacity:>10,}{r.batch_size:>7}{median(r.insert_transitions_per_sec):>22,.0f}"
                     f"{median(r.sample_batches_per_sec):>18,.0f}{ratio:>14}")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(",") if part)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness.analyses.replay_bench``: list vs tensor replay insert and sample rates."""
    parser = argparse.ArgumentParser(prog="python -m harness.analyses.replay_bench", description=main.__doc__)
    parser.add_argument("--kinds", default=",".join(KINDS), help="list,tensor")
    parser.add_argument("--capacities", type=_ints, default=CAPACITIES, metavar="N,N,...")
    parser.add_argument("--batch-sizes", type=_ints, default=BATCH_SIZES, metavar="B,B,...")
    parser.add_argument("--device", default="cpu", help="cpu | cuda[:N] | mps | auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.2, help="length of each timed window")
    parser.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = parser.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)}; accepted: {', '.join(KINDS)}")
    results = measure_replay(kinds, args.capacities, args.batch_sizes, device=args.device, repeats=args.repeats,
                             min_seconds=args.min_seconds)
    if args.json:
        import json

        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
