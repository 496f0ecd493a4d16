"""The ``rlgauge`` command: a parser, a dispatch table, and one short ``cmd_*`` per subcommand.

Exit codes: 0 success, 1 a check failed (an unstable or failed run, a failed gate check) or an
unexpected internal failure (one line; ``--debug`` adds the traceback), 2 bad input (one line on
stderr, no traceback), 130 interrupted (partial result written, marked).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NoReturn

import yaml
from rich.console import Console

from reference_trainers.config.schema import ConfigError, to_plain_dict

from harness.cli import analysis_commands as analysis
from harness.cli import detection_command
from harness.cli import try_command
from harness.cli.options import (DEBUG_ENV, EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERNAL_ERROR, EXIT_INTERRUPTED,
                          DEVICE_HELP, EXIT_OK, VersionAction, add_debug_option, debug_from_env, run_options,
                          user_overrides)
from harness.analyses.gate_outcome import GateVerdict, Outcome, verdict_of
from harness.errors import NoVerdict, UserError
from harness.specs.own_trainer import OwnConfig
from harness.measurement.interrupts import stop_on_signals
from harness.specs.presets import (Preset, VariantSpec, left_out, list_presets, listing_lines, load_preset, specs_for,
                                   specs_of, variant_names)
from harness.stats.compare import Pair, comparison_table
from harness.analyses.devices import device_list
from harness.report.tables import results_table
from harness.results import check_writable, load_results, save_results

if TYPE_CHECKING:
    from harness.measurement.checkpoints import Checkpointing
    from harness.analyses.gate import Thresholds



TARGET_HELP = "a preset name (see 'rlgauge presets') or a YAML config file"
VARIANT_HELP = ("the variants {what}: one the file defines, a comma list of them (e.g. baseline,fused_adam: interleaved "
                "in one process, each compared with the first), all, or both (baseline and optimized; the default)")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlgauge", description="Benchmark harness for the speed of RL training. "
                     "'rlgauge COMMAND --help' describes each command.")
    parser.add_argument("--version", action=VersionAction,
                        help="print rlgauge's version and the torch build, then exit")
    add_debug_option(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    run = sub.add_parser("run", help="measure a preset's variants (baseline vs optimized) or a config file",
                         description="Measure a preset's baseline and optimized variants, interleaved in this "
                                     "process, and print them side by side with their ratio (or measure the one "
                                     "run of a plain config file).")
    run.add_argument("target", metavar="PRESET|FILE.yaml", nargs="?",
                     help=TARGET_HELP + " (a file may name your own trainer with trainer: MODULE:ATTRIBUTE)")
    run.add_argument("--trainer", metavar="MODULE:ATTRIBUTE",
                     help="measure your own trainer: a factory make_trainer(config, *, device, seed) importable from "
                          "the current folder or PYTHONPATH (docs/own-trainer.md)")
    run.add_argument("--config", type=Path, metavar="FILE.yaml",
                     help="with --trainer: its settings (config:, variants:, run:), or a plain mapping of them")
    run.add_argument("--variant", default="both", metavar="NAME[,NAME...]|all|both",
                     help=VARIANT_HELP.format(what="measured"))
    run_options(run, device_help=DEVICE_HELP + "; or a list, e.g. cpu,cuda: the variants measured on each device, "
                                               "interleaved, with their ratio")
    run.add_argument("--out", type=Path, metavar="RESULT.json", help="write the results here (atomically)")
    run.add_argument("--quiet", action="store_true", help="no progress bar or optimisation summary")
    run.add_argument("--checkpoint-every", type=int, metavar="N",
                     help="save a checkpoint each time the run passes a multiple of N env steps, and at the end")
    run.add_argument("--checkpoint-dir", type=Path, metavar="DIR",
                     help="where checkpoints go (default: checkpoints/ beside --out, or in the current folder)")
    run.add_argument("--resume", type=Path, metavar="PATH",
                     help="continue from a checkpoint file (or the folder holding it) of the same preset and config")
    run.add_argument("--peer", metavar="NAME", help="also measure a peer library on matched settings, interleaved "
                     "(sb3: Stable-Baselines3 PPO/DQN; needs pip install 'rlgauge[peers]')")

    sub.add_parser("presets", help="list the shipped presets",
                   description="List the shipped presets: name, one-line description and variants.")

    config = sub.add_parser("config", help="print the resolved config (every flag with its resolved value)",
                            description="Print the config a run would use, as YAML, one document per variant: "
                                        "every key with its resolved value and why each 'auto' resolved as it "
                                        "did. Nothing runs.")
    config.add_argument("target", metavar="PRESET|FILE.yaml", help=TARGET_HELP)
    config.add_argument("--variant", default="both", metavar="NAME[,NAME...]|all|both",
                        help=VARIANT_HELP.format(what="printed"))
    run_options(config)

    compare = sub.add_parser("compare", help="two result files side by side (or a file's variants), ratios with CIs",
                             description="Show two result files side by side (or the variants of one file), "
                                         "with ratios and their bootstrap confidence intervals.")
    compare.add_argument("files", nargs="+", type=Path, metavar="RESULT.json",
                         help="A.json B.json (B against A), or one file (its variants against each other)")
    compare.add_argument("--confidence", type=float, help="level of the bootstrap intervals (default: gates.yaml)")

    gate = sub.add_parser("gate", help="exit 1 on a confirmed slowdown, a speedup below a minimum, or instability",
                          description="A regression gate: exit 1 on a confirmed slowdown (--baseline/--candidate "
                                      "files, or --base REF against this checkout), a speedup below --min-speedup "
                                      "(--run), or an unstable run.")
    gate.add_argument("--baseline", type=Path, metavar="A.json", help="result file of the reference build")
    gate.add_argument("--candidate", type=Path, metavar="B.json", help="result file of the build under test")
    gate.add_argument("--max-slowdown", type=float, metavar="PCT", help="tolerated throughput loss in %% (with --baseline)")
    gate.add_argument("--run", metavar="PRESET|FILE.yaml", help="measure both variants interleaved in this process")
    gate.add_argument("--min-speedup", type=float, metavar="X", help="minimum optimized/baseline speedup (with --run)")
    gate.add_argument("--variant", metavar="NAME[,NAME...]|all|both",
                      help="with --run: the variants measured, as run's --variant (default: both); each is gated "
                           "against the first")
    gate.add_argument("--base", metavar="REF",
                      help="measure the optimized variant of git REF and of this checkout in alternating processes "
                           "(--run PRESET, default ppo-cartpole); exit 1 on a confirmed slowdown beyond --max-slowdown")
    gate.add_argument("--rounds", type=int, metavar="N", help="with --base: alternating rounds, one process per side each (default 3)")
    run_options(gate)
    gate.add_argument("--out", type=Path, metavar="RESULT.json", help="with --run: write the measured results here")
    gate.add_argument("--quiet", action="store_true", help="with --run: no progress bar or optimisation summary")
    gate.add_argument("--confidence", type=float, help="level of the bootstrap intervals")
    gate.add_argument("--allow-compile-fallback", action="store_true", help="a torch.compile fallback does not fail")
    gate.add_argument("--allow-untrustworthy", action="store_true",
                      help="gate runs whose quality verdict says they are not trustworthy (their reasons become warnings)")
    gate.add_argument("--allow-config-mismatch", action="store_true",
                      help="gate runs that differ in algorithm, env or batch shape (the mismatch is shown as a "
                           "waived check)")
    gate.add_argument("--thresholds", type=Path, metavar="FILE.yaml", help="thresholds file (default: harness/analyses/gates.yaml)")

    record = sub.add_parser("record", help="append one RUNS.md row per run of the given result files",
                            description="Append one RUNS.md row per run of the given result files, under a "
                                        "milestone; earlier rows are never rewritten.")
    record.add_argument("files", nargs="+", type=Path, metavar="RESULT.json",
                        help="result files written by run --out (every one is checked before a row is written)")
    record.add_argument("--milestone", required=True, metavar="NAME", help="the milestone the rows belong to")
    record.add_argument("--runs-md", type=Path, default=Path("RUNS.md"), metavar="PATH",
                        help="the file to append to (default: RUNS.md in the current folder)")
    analysis.add_parsers(sub)
    try_command.add_parser(sub)
    detection_command.add_parser(sub)
    for command in sub.choices.values():
        add_debug_option(command, top_level=False)  # 'rlgauge run ... --debug' works too
    return parser


class _Captured:
    """Where a ``--quiet`` run's trainer stdout went, and how many lines it holds."""

    def __init__(self, path: Path | None) -> None:
        self.path, self.lines = path, 0


@contextlib.contextmanager
def _trainer_stdout(args: argparse.Namespace | None) -> Iterator[_Captured]:
    """Under ``--quiet``, the trainer's own stdout goes to ``OUT.stdout.txt`` (without ``--out``:
    ``rlgauge-stdout.txt`` in the current folder), kept only when something was printed.

    The run writes a file of its own beside that name and renames it there at the end, so two
    quiet runs in one folder never write into, or remove, each other's file (the later one's
    output then holds the name)."""
    if args is None or not getattr(args, "quiet", False):
        yield _Captured(None)
        return
    out = getattr(args, "out", None)
    captured = _Captured(Path(f"{out}.stdout.txt") if out is not None else Path("rlgauge-stdout.txt"))
    captured.path.parent.mkdir(parents=True, exist_ok=True)  # as writing --out does
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=captured.path.parent, delete=False,
                                         prefix=f".{captured.path.name}.", suffix=".part")
    own = Path(handle.name)
    try:
        with handle, contextlib.redirect_stdout(handle):
            yield captured
    finally:  # an interrupted run keeps what its trainer printed too
        with open(own, encoding="utf-8") as written:
            captured.lines = sum(1 for _ in written)
        if captured.lines:
            os.replace(own, captured.path)
        else:
            own.unlink(missing_ok=True)


def _measure(specs: list, args: argparse.Namespace, checkpointing: Checkpointing | None = None) -> tuple[list, bool]:
    """Run resolved specs (``run`` and ``gate --run``): progress on stderr, table on stdout, ``--out`` written.

    Under torchrun every rank trains; rank 0 alone prints and writes ``--out``."""
    from reference_trainers.runtime import distributed

    from harness.measurement.runner import run_variants

    main_process = distributed.is_main_process()
    quiet = args.quiet or not main_process
    say = (lambda _text: None) if quiet else (lambda text: print(text, file=sys.stderr))
    show_progress = not quiet and sys.stderr.isatty()
    with stop_on_signals() as signals:  # Ctrl-C / SIGTERM: interrupted results, still written below
        with _trainer_stdout(args if main_process else None) as captured:
            results, interrupted = run_variants(specs, show_progress=show_progress, say=say,
                                                checkpointing=checkpointing)
        if captured.lines:
            for result in results:
                result.trainer_stdout = str(captured.path)
            print(f"rlgauge: the trainer's own output ({captured.lines} lines) is in {captured.path}", file=sys.stderr)
        signals.hold()
        if not main_process:
            return results, interrupted
        if interrupted:
            steps = ", ".join(f"{r.variant} {r.steps_completed:,}" for r in results)
            cause = f" by {signals.received[0]}" if signals.received else ""
            print(f"rlgauge: interrupted{cause} (timed env steps completed: {steps})", file=sys.stderr)
        _console().print(results_table(results))
        warn_untrustworthy(results)
        if args.out is not None:
            try:
                save_results(args.out, results)
            except OSError as exc:
                raise UserError(f"--out {args.out}: cannot write the result ({exc.strerror or exc})") from None
            print(f"results written to {args.out}" + (" (marked interrupted)" if interrupted else ""), file=sys.stderr)
    return results, interrupted


def warn_untrustworthy(results: list) -> None:
    """One stderr warning line per reason a run's figures are not trustworthy."""
    for result in results:
        for reason in (result.quality or {}).get("reasons", []):
            print(f"rlgauge: warning: {result.preset}/{result.variant} is not trustworthy: {reason}", file=sys.stderr)


def _console() -> Console:
    """Wide enough for the tables in a CI log or a pipe (rich assumes 80 columns there)."""
    return Console(soft_wrap=False, width=max(160, Console().width))


def _join_process_group(resolutions: list) -> None:
    """Under ``distributed.enabled`` (checked against torchrun's environment), join the process group."""
    from reference_trainers.runtime import distributed

    enabled = {r.config.distributed.enabled for r in resolutions}
    if len(enabled) > 1:
        raise UserError("distributed.enabled: every variant of a run must agree (set it with --set for all of them)")
    first = resolutions[0]
    distributed.join(first.config.distributed, first.device)


def _checkpointing(args: argparse.Namespace, specs: list, resolutions: list) -> Checkpointing | None:
    """``--checkpoint-every`` / ``--checkpoint-dir`` / ``--resume``, checked before anything runs."""
    from harness.measurement.checkpoints import (Checkpointing, check_envs, check_every, default_directory, file_name,
                              load_run_checkpoint, resume_file)

    check_every(args.checkpoint_every)
    if args.checkpoint_every is None and args.resume is None:
        if args.checkpoint_dir is not None:
            raise UserError("--checkpoint-dir: only used with --checkpoint-every or --resume")
        return None
    preset = specs[0].preset
    resumed = None
    if args.resume is not None:
        configs = {spec.variant: res.config for spec, res in zip(specs, resolutions)}
        resumed = load_run_checkpoint(resume_file(args.resume, preset), preset, configs)
    path = (args.checkpoint_dir or default_directory(args.out)) / file_name(preset)
    if args.checkpoint_every is not None:
        check_envs([res.config for res in resolutions])
        try:
            check_writable(path)
        except UserError as exc:
            raise UserError(str(exc).replace("--out", "--checkpoint-dir", 1)) from None
    return Checkpointing(args.checkpoint_every, path, resumed)


def cmd_run(args: argparse.Namespace) -> int:
    from reference_trainers.runtime import distributed

    from harness.measurement.runner import resolve_specs

    devices = device_list(args.device)  # --device cpu,cuda: the variants on each device, interleaved
    preset = _run_preset(args)
    specs = specs_of(preset, args.variant, user_overrides(args)) if devices is None else _device_specs(args, devices)
    _note_left_out(preset, args.variant, "run")
    resolutions = resolve_specs(specs)  # every flag checked before anything runs
    own = isinstance(specs[0].config, OwnConfig)
    if devices is not None and any(getattr(r.config, "distributed", None) and r.config.distributed.enabled
                                   for r in resolutions):
        raise UserError(f"--device {args.device}: a device comparison runs in one process; accepted: a device list "
                        "without distributed.enabled")
    if own and args.peer is not None:
        raise UserError("--peer: peers are matched from rlgauge's own presets; accepted: --peer with a preset, "
                        "not with your own trainer")
    if args.peer is not None:
        if args.checkpoint_every is not None or args.resume is not None:
            raise UserError("--peer: a peer library's trainer has no checkpoints; accepted: --peer without "
                            "--checkpoint-every and --resume")
        if any(r.config.distributed.enabled for r in resolutions):
            raise UserError("--peer: the peer trains in one process; accepted: --peer without distributed.enabled")
    if not own:
        _join_process_group(resolutions)
    main_process = distributed.is_main_process()
    try:
        checkpointing = _checkpointing(args, specs, resolutions)
        if args.peer is not None:
            specs.append(_peer_spec(args))
        if args.out is not None and main_process:
            check_writable(args.out)
        results, interrupted = _measure(specs, args, checkpointing)
    finally:
        distributed.teardown()
    if devices is not None and not interrupted and main_process:
        from harness.analyses.devices import comparison_table

        _console().print(comparison_table(results))
    if args.peer is not None and not interrupted:
        from harness.specs.peers.tables import peer_table

        _console().print(peer_table(results, args.peer))
    if devices is None and args.peer is None and len(results) > 2 and main_process and not interrupted:
        _print_reference_ratios(results)
    if interrupted:
        return EXIT_INTERRUPTED
    bad = [r for r in results if r.status != "ok"]
    for result in bad if main_process else []:
        from harness.measurement.sentinels import instability

        detail = result.error or instability(result.stability)
        whose = f" of your trainer {result.config['trainer']}" if own else ""
        print(f"rlgauge: {result.variant} run{whose} is {result.status}: {detail}", file=sys.stderr)
    return EXIT_CHECK_FAILED if bad else EXIT_OK


def _device_specs(args: argparse.Namespace, devices: list[str]) -> list[VariantSpec]:
    """``run --device A,B``: the run's specs on each device, variants named ``VARIANT@DEVICE``."""
    from harness.analyses.devices import specs_on_devices

    for option, given in (("--peer", args.peer), ("--checkpoint-every", args.checkpoint_every),
                          ("--resume", args.resume)):
        if given is not None:
            raise UserError(f"--device {args.device}: {option} is not taken with a device list; accepted: one device "
                            f"with {option}")
    return specs_on_devices(devices, lambda device: _run_specs(argparse.Namespace(**{**vars(args), "device": device})))


def _run_specs(args: argparse.Namespace) -> list[VariantSpec]:
    """``run``'s specs: a preset or file, or ``--trainer`` (with ``--config``)."""
    return specs_of(_run_preset(args), args.variant, user_overrides(args))


def _run_preset(args: argparse.Namespace) -> Preset:
    """What ``run`` measures: a preset or file, or ``--trainer`` (with ``--config``)."""
    from harness.specs.presets import own_trainer_preset

    if args.trainer is None:
        if args.config is not None:
            raise UserError("--config: only used with --trainer; a preset or config file is given as PRESET|FILE.yaml")
        if args.target is None:
            raise UserError("run: the argument PRESET|FILE.yaml is required (see 'rlgauge presets'), or --trainer "
                            "MODULE:ATTRIBUTE")
        return load_preset(args.target)
    if args.target is not None:
        raise UserError(f"run: with --trainer, give the settings file as --config {args.target} (not as a positional "
                        "argument)")
    return own_trainer_preset(args.trainer, args.config)


def _note_left_out(preset: Preset, selection: str, command: str) -> None:
    """One stderr line when ``--variant both`` (the default) leaves out variants the file defines:
    they are never dropped silently. ``command``: ``run``, ``config`` or ``gate --run``."""
    if selection != "both":
        return
    names = variant_names(preset, selection)
    others = left_out(preset, names)
    if others:
        print(f"rlgauge: note: {preset.name} also defines {', '.join(others)}: left out by {command}'s --variant both "
              f"({' and '.join(names)}); select them with --variant all, or a list: --variant "
              f"{','.join([names[0], *others])}", file=sys.stderr)


def _print_reference_ratios(results: list) -> None:
    """Three or more variants: each one's env-step rate against the first (the reference), with its verdict."""
    from harness.stats.compare import env_rate_line, variant_pairs

    for pair in variant_pairs(results):
        print(env_rate_line(pair))


def _peer_spec(args: argparse.Namespace) -> VariantSpec:
    """The peer's spec, matched from the baseline variant's config; prints the matching table. The peer
    is built as a user's own trainer is: its factory on the public contract, through ``own_trainer``."""
    from reference_trainers.config.resolve import resolve_config

    from harness.specs.own_trainer import OwnConfig, own_builder
    from harness.specs.peers import load_peer
    from harness.specs.peers.tables import matching_table

    peer = load_peer(args.peer)
    base = specs_for(args.target, "baseline", user_overrides(args))[0]
    resolved = resolve_config(base.config).config
    rows = peer.matching(resolved)
    _console().print(matching_table(args.peer, rows))
    config = OwnConfig(peer.FACTORY, peer.peer_settings(resolved), resolved.run, resolved.device, resolved.seed)
    return VariantSpec(base.preset, args.peer, config, build=own_builder(peer.FACTORY))


def cmd_presets(args: argparse.Namespace) -> int:
    """One line per preset; on a terminal, long descriptions wrap under their own column."""
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    for line in listing_lines(list_presets(), width):
        print(line)
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    from harness.measurement.runner import resolve_specs

    documents = []
    preset = load_preset(args.target)
    specs = specs_of(preset, args.variant, user_overrides(args))
    _note_left_out(preset, args.variant, "config")
    for spec, resolution in zip(specs, resolve_specs(specs)):
        header = f"# {spec.preset} / {spec.variant}\n"
        reasons = "".join(f"# {key}: auto -> {why}\n" for key, why in resolution.reasons.items())
        plain = resolution.config.plain() if isinstance(resolution.config, OwnConfig) else to_plain_dict(resolution.config)
        documents.append(header + reasons + yaml.safe_dump(plain, sort_keys=False))
    print("---\n".join(documents), end="")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from harness.stats.compare import file_pairs, variant_pairs
    from harness.analyses.gate import load_thresholds

    if len(args.files) > 2:
        raise UserError(f"compare takes one or two result files, got {len(args.files)}")
    confidence = load_thresholds().with_overrides(confidence=args.confidence).confidence
    runs = [load_results(path) for path in args.files]
    if len(runs) == 1:
        pairs = variant_pairs(runs[0], str(args.files[0]))
        headers: tuple[str | None, str | None] = (None, None)
    else:
        pairs = file_pairs(runs[0], runs[1], str(args.files[0]), str(args.files[1]))
        headers = (f"A: {args.files[0]}", f"B: {args.files[1]}")
    warned: set[int] = set()
    for pair in pairs:
        base_header = None if headers[0] is None else f"{headers[0]} ({pair.base.variant})"
        cand_header = None if headers[1] is None else f"{headers[1]} ({pair.cand.variant})"
        _console().print(comparison_table(pair, confidence=confidence, base_header=base_header,
                                          cand_header=cand_header))
        _print_run_states(pair, headers, warned)
        _warn_if_not_comparable(pair)
    return EXIT_OK


def _print_run_states(pair: Pair, headers: tuple[str | None, str | None], warned: set[int]) -> None:
    """Under a comparison: each run's machine state and quality (stdout); a warning per untrustworthy run
    (stderr, once per run however many pairs it is in)."""
    from harness.stats.compare import state_line, untrustworthy_warning

    for run, header in ((pair.base, headers[0]), (pair.cand, headers[1])):
        label = f"{run.preset}/{run.variant}" + ("" if header is None else f" ({header.partition(':')[0]})")
        print(state_line(label, run))
        warning = untrustworthy_warning(label, run)
        if warning is not None and id(run) not in warned:
            warned.add(id(run))
            print(warning, file=sys.stderr)


def _warn_if_not_comparable(pair: Pair) -> None:
    from harness.stats.compare import config_differences, machine_differences

    machines = machine_differences(pair.base, pair.cand)
    if machines:
        print(f"rlgauge: note: {pair.label}: measured on different machines ({', '.join(machines)} differ)",
              file=sys.stderr)
    configs = config_differences(pair.base, pair.cand)
    if configs and pair.base.variant == pair.cand.variant:
        shown = ", ".join(configs[:5]) + (f" and {len(configs) - 5} more" if len(configs) > 5 else "")
        print(f"rlgauge: note: {pair.label}: configs differ in {shown}", file=sys.stderr)


def _gate_files_mode(args: argparse.Namespace) -> bool:
    """True for ``--baseline/--candidate``, False for ``--run``; ``UserError`` for a mix of the two."""
    files_mode = args.baseline is not None or args.candidate is not None
    if files_mode == (args.run is not None):
        raise UserError("gate needs either --baseline A.json --candidate B.json, or --run PRESET (not both)")
    run_only = [flag for flag, given in (("--min-speedup", args.min_speedup is not None), ("--out", args.out),
                                         ("--variant", args.variant),
                                         ("--set", args.overrides), ("--device", args.device), ("--steps", args.steps),
                                         ("--repeats", args.repeats), ("--seed", args.seed)) if given]
    if files_mode:
        if args.baseline is None or args.candidate is None:
            raise UserError("gate: --baseline and --candidate go together (the two result files to compare)")
        if run_only:
            raise UserError(f"gate: {run_only[0]} applies to --run only, not to --baseline/--candidate")
    elif args.max_slowdown is not None:
        raise UserError("gate: --max-slowdown applies to --baseline/--candidate; with --run use --min-speedup")
    return files_mode


def gate_verdict(args: argparse.Namespace) -> GateVerdict:
    """``rlgauge gate``'s decision, typed: what the CLI prints and exits with, and what ``harness.gate`` returns."""
    return verdict_of(lambda: _gate(args))


def cmd_gate(args: argparse.Namespace) -> int:
    verdict = gate_verdict(args)
    if verdict.outcome in (Outcome.NO_VERDICT, Outcome.BAD_INPUT) and verdict.reason:
        print(f"rlgauge: error: {verdict.reason}", file=sys.stderr)  # always one line
    elif verdict.outcome is Outcome.INTERRUPTED and verdict.reason:
        print("rlgauge: interrupted", file=sys.stderr)
    return verdict.exit_code


def _gate(args: argparse.Namespace) -> int:
    if args.base is not None:
        from harness.analyses.cross_commit import cmd_gate_base

        if args.variant is not None:
            raise UserError("gate: --variant applies to --run; --base measures the optimized variant")
        return cmd_gate_base(args)
    from harness.analyses.gate import check_quality, check_setup, checks_table, failed, gate_files, load_thresholds, underpowered

    files_mode = _gate_files_mode(args)
    thresholds = load_thresholds(args.thresholds).with_overrides(
        max_slowdown_pct=args.max_slowdown, min_speedup=args.min_speedup, confidence=args.confidence,
        allow_compile_fallback=args.allow_compile_fallback)

    if files_mode:
        base_runs, cand_runs = load_results(args.baseline), load_results(args.candidate)
        checks, pairs = gate_files(base_runs, cand_runs, thresholds)
        sides = (f"--baseline {args.baseline}", f"--candidate {args.candidate}")
        checks = check_setup(pairs, args.allow_config_mismatch, sides) + checks
        title = f"gate: {args.candidate} against {args.baseline}"
        gated = [(f"{r.preset}/{r.variant} ({path})", r) for path, runs in ((args.baseline, [p.base for p in pairs]),
                                                                           (args.candidate, cand_runs)) for r in runs]
        notes = check_quality(gated, args.allow_untrustworthy)
    else:
        measured = _gate_run(args, thresholds)
        if measured is None:
            return EXIT_INTERRUPTED
        checks, pairs, results = measured
        checks = check_setup(pairs, args.allow_config_mismatch, ("baseline", "optimized")) + checks
        title = f"gate: {args.run}, variants interleaved in one process"
        notes = [line for line in check_quality([(f"{r.preset}/{r.variant}", r) for r in results],
                                                args.allow_untrustworthy)
                 if not line.startswith("rlgauge: warning:")]  # _measure has printed the warnings
    refusal = underpowered(checks)
    if refusal is not None:
        raise NoVerdict(refusal)
    for line in notes:
        print(line, file=sys.stderr)
    for check in checks:
        if check.waived:
            print(f"rlgauge: warning: {check.run}: setup differs: {check.measured}; {check.note}", file=sys.stderr)
    for pair in pairs:
        _warn_if_not_comparable(pair)
    console = _console()
    console.print(checks_table(checks, title))
    bad = failed(checks)
    if bad:
        console.print(checks_table(bad, f"failed: {len(bad)} of {len(checks)} checks"))
        print(f"rlgauge: gate failed: {len(bad)} of {len(checks)} checks", file=sys.stderr)
        return EXIT_CHECK_FAILED
    print(f"rlgauge: gate passed ({sum(c.passed is True for c in checks)} checks)", file=sys.stderr)
    return EXIT_OK


def _gate_run(args: argparse.Namespace, thresholds: Thresholds) -> tuple[list, list[Pair], list] | None:
    """``gate --run``: measure both variants (enough repeats checked first, nothing run without them),
    once more if the speedup fails just short of its minimum; (checks, pairs, runs), None if interrupted."""
    from harness.stats import power
    from harness.analyses.gate import check_spec_setup, gate_variants, no_power_message, remeasure_reason
    from harness.measurement.runner import resolve_specs

    preset, selection = load_preset(args.run), args.variant or "both"
    specs = specs_of(preset, selection, user_overrides(args))
    _note_left_out(preset, selection, "gate --run")
    if len(specs) < 2:
        what = ("it has no variants: section (one run)" if preset.single else f"--variant {selection} selects "
                f"{specs[0].variant} only (defined: {', '.join(preset.variants)}; accepted: --variant all, or a list)")
        raise UserError(f"gate --run {args.run}: needs a preset with two variants or more, each gated against the "
                        f"first; {what}")
    if not args.allow_config_mismatch:
        check_spec_setup(specs)  # variants differing in more than flags: refused before anything runs
    repeats = min(resolution.config.run.repeats for resolution in resolve_specs(specs))
    if not power.has_power(repeats):
        raise NoVerdict(no_power_message(repeats))
    if args.out is not None:
        check_writable(args.out)
    results, interrupted = _measure(specs, args)
    if interrupted:
        return None
    checks, pairs = gate_variants(results, thresholds)
    why = remeasure_reason(results, checks, thresholds)
    if why is not None:
        print(f"rlgauge: gate: measuring once more, the second measurement decides: {why}", file=sys.stderr)
        results, interrupted = _measure(specs, args)
        if interrupted:
            return None
        checks, pairs = gate_variants(results, thresholds)
    return checks, pairs, results


def cmd_record(args: argparse.Namespace) -> int:
    from harness.report.runs_md import append_rows, check_milestone, format_rows

    milestone = check_milestone(args.milestone)
    groups = [load_results(path) for path in args.files]  # every file checked before anything is written
    if not any(groups):
        raise UserError("record: the result files hold no runs")
    rows = format_rows(milestone, groups)
    append_rows(args.runs_md, rows)
    print(f"appended {len(rows)} row{'s' * (len(rows) != 1)} to {args.runs_md} (milestone {milestone!r})",
          file=sys.stderr)
    return EXIT_OK


COMMANDS = {"run": cmd_run, "presets": cmd_presets, "config": cmd_config, "compare": cmd_compare,
            "gate": cmd_gate, "record": cmd_record, **analysis.COMMANDS,
            **try_command.COMMANDS, **detection_command.COMMANDS}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rlgauge`` and ``python -m harness``; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="rlgauge: %(message)s")
    debug = False
    try:
        debug = debug_from_env(os.environ.get(DEBUG_ENV))
        args = build_parser().parse_args(argv)
        debug = debug or args.debug
        # a trainer's failure inside a run logs its traceback at debug level (reset each call: in-process callers)
        logging.getLogger("rlgauge").setLevel(logging.DEBUG if debug else logging.NOTSET)
        with stop_on_signals():  # SIGTERM ends a command as Ctrl-C does: cleanly, exit code 130
            return COMMANDS[args.command](args)
    except (UserError, ConfigError) as exc:
        print(f"rlgauge: error: {' '.join(str(exc).split())}", file=sys.stderr)  # always one line
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rlgauge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
    except Exception as exc:  # a bug, not bad input: one line, the traceback on request
        return _internal_error(exc, debug)


def _internal_error(exc: Exception, debug: bool) -> int:
    """An unexpected failure: its traceback under ``--debug``, then one line naming it."""
    if debug:
        traceback.print_exc(file=sys.stderr)
    message = " ".join(str(exc).split())
    line = f"rlgauge: error: {type(exc).__name__}" + (f": {message}" if message else "")
    hint = "" if debug else " (run with --debug for the traceback)"
    print(line + hint, file=sys.stderr)
    return EXIT_INTERNAL_ERROR
