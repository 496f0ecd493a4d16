"""What one ``iterate()`` did, and how a trainer runs on its own.

A trainer is built as ``Trainer(config, probe=None, resolution=None)``; what the harness calls
on it is ``reference_trainers.Trainer``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from reference_trainers.runtime import distributed
from reference_trainers.config.schema import TrainConfig, build_config
from reference_trainers.config.files import read_yaml
from reference_trainers.config.errors import ConfigError
from reference_trainers.config.flags import budget_overrides


@dataclass(frozen=True)
class IterationResult:
    """What one ``iterate()`` did: sub-env frames, agent decisions and optimiser steps."""

    env_steps: int
    agent_steps: int
    updates: int


def _step_budget(text: str) -> int:
    """``--steps``: an integer >= 1 (a budget of 0 or less would exit 0 having trained nothing)."""
    try:
        steps = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; accepted: an integer >= 1") from None
    if steps < 1:
        raise argparse.ArgumentTypeError(f"{steps} trains nothing; accepted: an integer >= 1")
    return steps


def train_from_command_line(build: Callable[[TrainConfig], Any], loss_key: str, argv: list[str] | None,
                            prog: str, description: str | None, algo: str = "ppo") -> int:
    """``python -m reference_trainers.<algo> --config FILE [--steps N] [--set KEY=VALUE]...``: train, print progress.

    The config's ``algo`` defaults to this module's; a config naming another algorithm is an
    error (exit 2, one line on stderr), as is any invalid setting.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--steps", type=_step_budget, default=50_000, help="env steps to train for (at least 1)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        data = read_yaml(args.config)
        data.setdefault("algo", algo)
        config = build_config(data, [*args.overrides, *budget_overrides(args.steps)])  # the budget is --steps
        if config.algo != algo:
            raise ConfigError(f"algo: {config.algo!r} cannot run under {prog}; accepted: {algo!r} (or no algo key)")
        trainer = build(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        while distributed.agreed_min(trainer.env_steps) < args.steps:
            trainer.iterate()
            if distributed.is_main_process():  # under torchrun, rank 0 speaks for all
                print(f"env_steps={trainer.env_steps} episodes={trainer.tracker.completed} "
                      f"mean_return={trainer.mean_recent_return()} loss={trainer.last_stats.get(loss_key)}")
    finally:
        trainer.close()
        distributed.teardown()
    return 0
