"""``harness.gate(...) -> GateVerdict``: ``rlgauge gate`` called from Python, with a typed outcome.

::

    from harness import Outcome, gate

    verdict = gate("bench.yaml", min_speedup=1.5)                          # gate --run
    verdict = gate(baseline="old.json", candidate="new.json", max_slowdown_pct=10)
    verdict = gate("ppo-cartpole", base="HEAD~1")                          # gate --base
    if verdict.outcome is Outcome.NO_VERDICT: ...                          # a busy machine, too few repeats

The gate runs in this process with its statistics and noise handling; what it printed is kept in
``verdict.output`` (shown live with ``capture=False``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path
from typing import Any

from harness.analyses.gate_outcome import GateVerdict, Outcome
from harness.errors import UserError


def gate_argv(target: str | Path | None = None, *, min_speedup: float | None = None,
              baseline: str | Path | None = None, candidate: str | Path | None = None, base: str | None = None,
              max_slowdown_pct: float | None = None, steps: int | None = None, repeats: int | None = None,
              rounds: int | None = None, sets: tuple[str, ...] = (), allow_untrustworthy: bool = False,
              out: str | Path | None = None, quiet: bool = False) -> list[str]:
    """The ``rlgauge gate`` arguments for these keywords (``--run`` for ``target``)."""
    argv: list[Any] = []
    for option, value in (("--run", target), ("--min-speedup", min_speedup), ("--baseline", baseline),
                          ("--candidate", candidate), ("--base", base), ("--max-slowdown", max_slowdown_pct),
                          ("--steps", steps), ("--repeats", repeats), ("--rounds", rounds), ("--out", out)):
        if value is not None:
            argv += [option, value]
    for text in sets:
        argv += ["--set", text]
    if allow_untrustworthy:
        argv.append("--allow-untrustworthy")
    if quiet:  # no progress bar; a trainer's own stdout kept out of the output (gate --run)
        argv.append("--quiet")
    return [str(a) for a in argv]


def gate(target: str | Path | None = None, *, capture: bool = True, **options: Any) -> GateVerdict:
    """Gate in this process, as ``rlgauge gate`` would (keywords: ``gate_argv``); never raises for bad input
    or a busy machine: the verdict's ``outcome`` says which."""
    from harness.cli.app import build_parser, gate_verdict

    printed = io.StringIO()
    with contextlib.ExitStack() as stack:
        if capture:
            stack.enter_context(contextlib.redirect_stdout(printed))
            stack.enter_context(contextlib.redirect_stderr(printed))
        try:
            args = build_parser().parse_args(["gate", *gate_argv(target, **options)])
        except UserError as exc:
            return GateVerdict(Outcome.BAD_INPUT, " ".join(str(exc).split()), printed.getvalue())
        verdict = gate_verdict(args)
    return dataclasses.replace(verdict, output=printed.getvalue())
