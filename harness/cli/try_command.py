"""``rlgauge try``: the parser and ``cmd_try``; the work is ``harness.trials``'s.

Diagnoses the user's own trainer in this process, then tries each change the findings point to, each in a
process of its own, in slices alternating with the unchanged trainer's (docs/try.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from harness.cli.options import (EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, run_options,
                                 note_trainer_output, trainer_output, user_overrides)
from harness.errors import UserError

EXIT_NO_PATCH = 3
"""``--patch`` not written: the combination changed the maths, failed or was slower, or the unchanged trainer is not
reproducible from its seed (one line says which)."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from harness.trials.processes.arms import DEFAULT_TIMEOUT_S
    from harness.trials.catalogue import accepted
    from harness.trials.parity import DEFAULT_ITERATIONS
    from harness.trials.rounds import DEFAULT_ROUNDS, MIN_ROUNDS
    from harness.trials.slices import CYCLES

    parser = sub.add_parser("try", help="try the changes a diagnosis points to on your own trainer, without editing "
                            "it: each measured against it in alternating slices, with what it does to the maths",
                            description="Diagnose your own trainer, then apply each change its findings point to "
                                        "(runtime changes in the trainer's process; source changes on copies of "
                                        "your files), measure each against the unchanged trainer in alternating "
                                        "slices of live processes, compare the parameters after a few iterations "
                                        "from the same seed, and combine those that were faster and kept the maths. "
                                        "Your files are only read.",
                            epilog=f"Exit codes: {EXIT_OK} done; {EXIT_CHECK_FAILED} a trial failed (the others are "
                                   f"measured) or the unchanged trainer failed; {EXIT_BAD_INPUT} bad input; "
                                   f"{EXIT_NO_PATCH} --patch not written because the combination changed the maths, "
                                   f"failed or was slower, or the unchanged trainer is not reproducible from its "
                                   f"seed (the report names what to seed); {EXIT_INTERRUPTED} interrupted.")
    parser.add_argument("target", nargs="?", default=None, metavar="FILE.yaml",
                        help="a YAML file naming your trainer with trainer: (or --trainer)")
    parser.add_argument("--trainer", metavar="MODULE:ATTRIBUTE",
                        help="your own trainer: a factory make_trainer(config, *, device, seed)")
    parser.add_argument("--config", type=Path, metavar="FILE.yaml", help="with --trainer: its settings")
    parser.add_argument("--variant", default=None, help="the variant tried (default: baseline, or the file's only one)")
    parser.add_argument("--only", metavar="a,b,...", help=f"only these changes, whatever the diagnosis found "
                        f"(accepted: {accepted()})")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help="at most this many rounds of fresh processes, one per arm kept alive while the arms take "
                             "turns in short slices; the round is the statistical unit (a verdict needs "
                             f"{MIN_ROUNDS}), and the try stops after {MIN_ROUNDS} or more once every change's "
                             f"interval is decisive (default: {DEFAULT_ROUNDS})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help="the longest an arm's process may go without progress (a finished iterate() call, a step "
                             "of its start, an answer); past it the process is stopped and that arm fails with one "
                             f"line, the others go on (default: {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--parity-iterations", type=int, default=DEFAULT_ITERATIONS,
                        help="iterate() calls, and at least as many optimizer steps, before the parameters are "
                             f"compared (default: {DEFAULT_ITERATIONS})")
    run_options(parser, steps_default="the file's run.steps; the diagnosis: 4096",
                repeats_default=f"{CYCLES} turns of every arm per round, each a slice of about 0.25 s between "
                                "two of the unchanged trainer")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--patch", type=Path, metavar="OUT.diff",
                        help="write the combination's changes as one unified diff (cd MODULE_FOLDER && "
                             "patch -p1 < OUT.diff), only when the combination itself kept the maths and was not "
                             f"found slower; otherwise nothing is written, one line says why and the exit code is "
                             f"{EXIT_NO_PATCH}")
    parser.add_argument("--force", action="store_true", help="with --patch: replace an existing file")
    parser.add_argument("--executor", metavar="local|ray[:ADDRESS]", default="local",
                        help="where the trials run: here (default), or as one Ray job on one machine of a cluster "
                             "(its arms alternate on that host; your files must be at the same path there)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress lines; the trainer's own stdout and stderr while it is diagnosed go to "
                             "rlgauge-try.stdout.txt / .stderr.txt (named on stderr when written)")


def _check_options(args: argparse.Namespace) -> list[str] | None:
    """Everything a bad option can be caught by before anything runs; the ``--only`` names."""
    from harness.results import check_writable
    from harness.trials.plan import parse_only

    from harness.campaigns.executors import parse_executor

    only = parse_only(args.only)
    args.executor_checked = parse_executor(args.executor)  # a bad --executor stops here, before the diagnosis
    if args.rounds < 2:
        raise UserError(f"--rounds {args.rounds}: accepted: 2 or more (fresh processes: one process's luck is not "
                        "a change's effect)")
    if args.parity_iterations < 1:
        raise UserError(f"--parity-iterations {args.parity_iterations}: accepted: 1 or more")
    if not args.timeout > 0 or args.timeout == float("inf"):
        raise UserError(f"--timeout {args.timeout:g}: accepted: a number of seconds above 0")
    if args.patch is not None:
        if args.patch.exists() and not args.force:
            raise UserError(f"--patch {args.patch}: the file exists; accepted: another path, or --force to replace it")
        check_writable(args.patch, "--patch")
    return only


def _target(args: argparse.Namespace, spec: object) -> tuple:
    """The arms' trainer (the file or --trainer, the diagnosed variant, the run options) and the factory's file."""
    from harness.trials.processes.arms import DEFAULT_TIMEOUT_S, Target

    trainer_text = spec.config.trainer  # type: ignore[attr-defined]
    module = sys.modules.get(trainer_text.partition(":")[0])
    path = getattr(module, "__file__", None)
    target = Target(str(Path(args.target).resolve()) if args.target else None, args.trainer,
                    str(args.config.resolve()) if args.config else None, spec.variant,  # type: ignore[attr-defined]
                    user_overrides(args), list(sys.path), spec.config.run.fair_threads,  # type: ignore[attr-defined]
                    timeout_s=getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S)
    return target, (Path(path).resolve() if path else None, trainer_text.partition(":")[2])


def cmd_try(args: argparse.Namespace) -> int:
    from harness.analyses import diagnose
    from harness.cli.diagnose_spec import diagnose_spec
    from harness.measurement.runner import resolve_specs
    from harness.specs.own_trainer import OwnConfig

    only = _check_options(args)
    if args.trainer is None and (args.target is None or not args.target.endswith((".yaml", ".yml"))):
        raise UserError(f"try {args.target or ''}: expected your own trainer: FILE.yaml with trainer:, or --trainer "
                        "MODULE:ATTRIBUTE (rlgauge's presets: rlgauge ablate)".replace("try :", "try:"))
    spec, label = diagnose_spec(args)
    if not isinstance(spec.config, OwnConfig):
        raise UserError(f"try {args.target}: the file names no trainer:; expected your own trainer (rlgauge's presets: "
                        "rlgauge ablate)")
    (resolution,) = resolve_specs([spec])
    say = (lambda _text: None) if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    say(f"try: diagnosing your trainer {spec.config.trainer} ({spec.variant}) on {resolution.device}")
    output = None
    try:
        # the trainer's prints stay out of the table and --json: to stderr, or under --quiet to named files
        with trainer_output(args.quiet, "rlgauge-try") as output:
            found = diagnose.diagnose(spec, resolution, label)
    except diagnose.DiagnosisFailed as failed:
        note_trainer_output(output)
        print(f"rlgauge: {failed}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except KeyboardInterrupt:
        note_trainer_output(output)
        return EXIT_INTERRUPTED
    note_trainer_output(output)
    return try_changes(args, spec, resolution, label, found, only)


def try_changes(args: argparse.Namespace, spec: object, resolution: object, label: str, found: dict,
                only: list[str] | None) -> int:
    """The trials after a diagnosis ``found`` (``rlgauge try``, ``rlgauge diagnose --try``): the table or JSON,
    the patch, the exit code."""
    from harness.trials import report as report_module
    from harness.trials.plan import candidates
    from harness.trials.session import run_try
    from reference_trainers.state.atomic_file import write_text_atomically

    say = (lambda _text: None) if getattr(args, "quiet", False) else \
        (lambda text: print(text, file=sys.stderr, flush=True))
    chosen = candidates(found, only)
    say("try: candidates: " + (", ".join(c.change.name + (" (not tried)" if c.skip else "") for c in chosen)
                               or "none (no finding points to a change this command makes)"))
    target, factory = _target(args, spec)
    from harness.campaigns.executors import parse_executor
    from harness.trials.slices import CYCLES

    executor = getattr(args, "executor_checked", None) or parse_executor(getattr(args, "executor", None))
    cycles = getattr(args, "repeats", None) or CYCLES
    if executor.name == "local":
        result = run_try(target, label, str(resolution.device), chosen, factory, args.rounds,  # type: ignore[attr-defined]
                         args.parity_iterations, say, cycles=cycles)
    else:
        result = _remote_try(executor, (target, label, str(resolution.device), chosen, factory, args.rounds,
                                        args.parity_iterations, cycles), say)
        if result is None:
            return EXIT_INTERRUPTED
    if args.json:
        print(json.dumps(report_module.as_json(result), indent=2))
    else:
        print(report_module.table(result))
    if result.workdir:
        print(f"rlgauge: work folder kept (requests and logs of what failed): {result.workdir}", file=sys.stderr)
    if result.failed:
        print(f"rlgauge: try stopped: {result.failed}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    if result.interrupted:
        print("rlgauge: interrupted; the trials above are those measured before it", file=sys.stderr)
        return EXIT_INTERRUPTED
    failed = [t for t in result.trials if t.error is not None]
    for trial in failed:
        print(f"rlgauge: {trial.name} failed: {trial.error}" + (f" (log: {trial.log})" if trial.log else ""),
              file=sys.stderr)
    if getattr(args, "patch", None) is not None:
        if result.patch:
            write_text_atomically(args.patch, result.patch)
            folder = factory[0].parent if factory[0] is not None else Path.cwd()
            say(f"try: patch written to {args.patch} (apply it: cd {folder} && patch -p1 < {args.patch.resolve()})")
            unstable = report_module.still_unstable(result)
            if unstable:
                print(f"rlgauge: {unstable}", file=sys.stderr)
        elif result.no_patch:
            print(f"rlgauge: {args.patch} not written: {result.no_patch}", file=sys.stderr)
            return EXIT_NO_PATCH
        else:
            say(f"try: no change was faster with the maths kept; {args.patch} not written")
    return EXIT_CHECK_FAILED if failed else EXIT_OK


def _remote_try(executor: object, job_args: tuple, say: Callable[[str], None]) -> object | None:
    """The whole try as one campaign job on one machine of the executor (its arms' slices must alternate on one
    host); the machine it ran on is said. None: interrupted before it finished."""
    from harness.campaigns.jobs import Job
    from harness.trials.session import run_try_job

    job = Job("try", run_try_job, job_args)
    say(f"try: sent to {executor.name} as one job (every arm on one machine; your module must be at the same "  # type: ignore[attr-defined]
        "path there)")
    gathered = executor.run([job], cpus_per_job=1)  # type: ignore[attr-defined]
    if "try" not in gathered.results:
        return None
    say(f"try: ran on {gathered.hosts.get('try', '?')}")
    return gathered.results["try"]


COMMANDS = {"try": cmd_try}
