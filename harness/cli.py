"""The ``rlgauge`` command: a parser, a dispatch table, and one short ``cmd_*`` per subcommand.

Exit codes: 0 success, 1 a check failed (an unstable or failed run, a failed gate check),
2 bad input (one line on stderr, no traceback), 130 interrupted (partial result written, marked).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import NoReturn

import yaml
from rich.console import Console

from reference_trainers.common.config import ConfigError, to_plain_dict
from reference_trainers.common.resolve import resolve_config

from .errors import UserError
from .presets import VARIANTS, list_presets, specs_for
from .compare import Pair, comparison_table
from .report import results_table
from .runner import VariantSpec, resolve_specs
from .results import check_writable, load_results, save_results

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see '{self.prog} --help')")


def _run_options(parser: argparse.ArgumentParser, steps_default: str = "the preset's",
                 repeats_default: str = "the preset's") -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set optimizations.amp=true (repeatable)")
    parser.add_argument("--device", help="auto | cpu | cuda[:N] | mps (default: the preset's, usually auto)")
    parser.add_argument("--steps", type=int, help=f"timed env-step budget of each repeat (default: {steps_default})")
    parser.add_argument("--repeats", type=int, help=f"timed repeats per variant, median/min/max (default: {repeats_default})")
    parser.add_argument("--seed", type=int, help="random seed")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rlgauge", description="Benchmark harness for the speed of RL training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="measure a preset's variants (baseline vs optimized) or a config file")
    run.add_argument("target", metavar="PRESET|FILE.yaml")
    run.add_argument("--variant", choices=[*VARIANTS, "both"], default="both")
    _run_options(run)
    run.add_argument("--out", type=Path, metavar="RESULT.json", help="write the results here (atomically)")
    run.add_argument("--quiet", action="store_true", help="no progress bar or optimisation summary")
    run.add_argument("--peer", metavar="NAME", help="also measure a peer library on matched settings, interleaved "
                     "(sb3: Stable-Baselines3 PPO/DQN; needs pip install 'rlgauge[peers]')")

    sub.add_parser("presets", help="list the shipped presets")

    config = sub.add_parser("config", help="print the resolved config (every flag with its resolved value)")
    config.add_argument("target", metavar="PRESET|FILE.yaml")
    config.add_argument("--variant", choices=[*VARIANTS, "both"], default="both")
    _run_options(config)

    compare = sub.add_parser("compare", help="two result files side by side (or a file's variants), ratios with CIs")
    compare.add_argument("files", nargs="+", type=Path, metavar="RESULT.json", help="A.json B.json, or one file")
    compare.add_argument("--confidence", type=float, help="level of the bootstrap intervals (default: gates.yaml)")

    gate = sub.add_parser("gate", help="exit 1 on a confirmed slowdown, a speedup below a minimum, or instability")
    gate.add_argument("--baseline", type=Path, metavar="A.json", help="result file of the reference build")
    gate.add_argument("--candidate", type=Path, metavar="B.json", help="result file of the build under test")
    gate.add_argument("--max-slowdown", type=float, metavar="PCT", help="tolerated throughput loss in %% (with --baseline)")
    gate.add_argument("--run", metavar="PRESET|FILE.yaml", help="measure both variants interleaved in this process")
    gate.add_argument("--min-speedup", type=float, metavar="X", help="minimum optimized/baseline speedup (with --run)")
    _run_options(gate)
    gate.add_argument("--out", type=Path, metavar="RESULT.json", help="with --run: write the measured results here")
    gate.add_argument("--quiet", action="store_true", help="with --run: no progress bar or optimisation summary")
    gate.add_argument("--confidence", type=float, help="level of the bootstrap intervals")
    gate.add_argument("--allow-compile-fallback", action="store_true", help="a torch.compile fallback does not fail")
    gate.add_argument("--thresholds", type=Path, metavar="FILE.yaml", help="thresholds file (default: harness/gates.yaml)")

    record = sub.add_parser("record", help="append one RUNS.md row per run of the given result files")
    record.add_argument("files", nargs="+", type=Path, metavar="RESULT.json")
    record.add_argument("--milestone", required=True, metavar="NAME", help="the milestone the rows belong to")
    record.add_argument("--runs-md", type=Path, default=Path("RUNS.md"), metavar="PATH",
                        help="the file to append to (default: RUNS.md in the current folder)")
    analysis_parsers(sub)
    return parser


def analysis_parsers(sub: argparse._SubParsersAction) -> None:
    """ablate, sweep, diagnose, matrix: the analysis commands (each takes the run options)."""
    ablate = sub.add_parser("ablate", help="attribute the speedup to each optimisation flag (all arms interleaved)")
    ablate.add_argument("target", metavar="PRESET|FILE.yaml")
    ablate.add_argument("--flags", metavar="a,b,...", help="only these flags (default: every flag the variants differ in)")
    ablate.add_argument("--expect", metavar="FLAG=1.5x,...", help="expected speedup of flags alone, shown beside the measured one")
    _run_options(ablate, steps_default="8192 for ablate", repeats_default="5 for ablate")
    ablate.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: ablation-PRESET/)")
    ablate.add_argument("--quiet", action="store_true", help="no progress bar or optimisation summary")

    sweep = sub.add_parser("sweep", help="throughput across values of a config key (two --param: a grid), interleaved")
    sweep.add_argument("target", metavar="PRESET|FILE.yaml")
    sweep.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a dotted config key and its values, each parsed like --set; a second --param makes a grid")
    sweep.add_argument("--variant", choices=VARIANTS, default="optimized", help="the variant swept (default: optimized)")
    _run_options(sweep, steps_default="8192 for sweep")
    sweep.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: sweep-PRESET/)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")

    diagnose = sub.add_parser("diagnose", help="environment report, a short profiled run, the env-only ceiling, advice")
    diagnose.add_argument("target", nargs="?", default="ppo-cartpole", metavar="PRESET|FILE.yaml",
                          help="what to profile (default: ppo-cartpole)")
    diagnose.add_argument("--variant", choices=VARIANTS, default="baseline",
                          help="the variant profiled (default: baseline, the plain paths)")
    _run_options(diagnose, steps_default="4096 for diagnose", repeats_default="1 for diagnose")
    diagnose.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    diagnose.add_argument("--no-compile-check", action="store_true", help="skip the torch.compile trial")

    matrix = sub.add_parser("matrix", help="every preset, both variants: one Markdown + HTML report with charts")
    matrix.add_argument("--presets", metavar="a,b,...", help="only these presets (default: all)")
    _run_options(matrix, steps_default="8192 for matrix")
    matrix.add_argument("--out", type=Path, metavar="DIR", help="report folder (default: rlgauge-matrix/)")
    matrix.add_argument("--quiet", action="store_true", help="no progress bar or per-preset lines")


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` values plus the run options, which are shorthands for config keys."""
    extra = list(args.overrides)
    for option, key in (("device", "device"), ("steps", "run.steps"), ("repeats", "run.repeats"), ("seed", "seed")):
        value = getattr(args, option)
        if value is not None:
            extra.append(f"{key}={value}")
    return extra


def _measure(specs: list, args: argparse.Namespace) -> tuple[list, bool]:
    """Run resolved specs (``run`` and ``gate --run``): progress on stderr, table on stdout, ``--out`` written."""
    from .runner import run_variants

    say = (lambda _text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))
    show_progress = not args.quiet and sys.stderr.isatty()
    results, interrupted = run_variants(specs, show_progress=show_progress, say=say)
    _console().print(results_table(results))
    if args.out is not None:
        try:
            save_results(args.out, results)
        except OSError as exc:
            raise UserError(f"--out {args.out}: cannot write the result ({exc.strerror or exc})") from None
        print(f"results written to {args.out}", file=sys.stderr)
    return results, interrupted


def _console() -> Console:
    """Wide enough for the tables in a CI log or a pipe (rich assumes 80 columns there)."""
    return Console(soft_wrap=False, width=max(160, Console().width))


def cmd_run(args: argparse.Namespace) -> int:
    specs = specs_for(args.target, args.variant, _overrides(args))
    resolve_specs(specs)  # every flag checked before anything runs
    if args.peer is not None:
        specs.append(_peer_spec(args))
    if args.out is not None:
        check_writable(args.out)
    results, interrupted = _measure(specs, args)
    if args.peer is not None and not interrupted:
        from .peers.tables import peer_table

        _console().print(peer_table(results, args.peer))
    if interrupted:
        return EXIT_INTERRUPTED
    bad = [r for r in results if r.status != "ok"]
    for result in bad:
        detail = result.error or f"float64_ops={result.stability['float64_ops']} nonfinite_events={result.stability['nonfinite_events']}"
        print(f"rlgauge: {result.variant} run is {result.status}: {detail}", file=sys.stderr)
    return EXIT_CHECK_FAILED if bad else EXIT_OK


def _peer_spec(args: argparse.Namespace) -> VariantSpec:
    """The peer's spec, matched from the baseline variant's config; prints the matching table."""
    from .peers import load_peer
    from .peers.tables import matching_table

    peer = load_peer(args.peer)
    base = specs_for(args.target, "baseline", _overrides(args))[0]
    rows = peer.matching(resolve_config(base.config).config)
    _console().print(matching_table(args.peer, rows))
    return VariantSpec(base.preset, args.peer, base.config, build=peer.build)


def cmd_presets(args: argparse.Namespace) -> int:
    for preset in list_presets():
        print(f"{preset.name:<16} {preset.description}  [variants: {', '.join(preset.variants)}]")
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    documents = []
    for spec in specs_for(args.target, args.variant, _overrides(args)):
        resolution = resolve_config(spec.config)
        header = f"# {spec.preset} / {spec.variant}\n"
        reasons = "".join(f"# {key}: auto -> {why}\n" for key, why in resolution.reasons.items())
        documents.append(header + reasons + yaml.safe_dump(to_plain_dict(resolution.config), sort_keys=False))
    print("---\n".join(documents), end="")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import file_pairs, variant_pairs
    from .gate import load_thresholds

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
    for pair in pairs:
        base_header = None if headers[0] is None else f"{headers[0]} ({pair.base.variant})"
        cand_header = None if headers[1] is None else f"{headers[1]} ({pair.cand.variant})"
        _console().print(comparison_table(pair, confidence=confidence, base_header=base_header,
                                          cand_header=cand_header))
        _warn_if_not_comparable(pair)
    return EXIT_OK


def _warn_if_not_comparable(pair: Pair) -> None:
    from .compare import config_differences, machine_differences

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


def cmd_gate(args: argparse.Namespace) -> int:
    from .gate import checks_table, failed, gate_files, gate_variants, load_thresholds

    files_mode = _gate_files_mode(args)
    thresholds = load_thresholds(args.thresholds).with_overrides(
        max_slowdown_pct=args.max_slowdown, min_speedup=args.min_speedup, confidence=args.confidence,
        allow_compile_fallback=args.allow_compile_fallback)

    if files_mode:
        base_runs, cand_runs = load_results(args.baseline), load_results(args.candidate)
        checks, pairs = gate_files(base_runs, cand_runs, thresholds)
        title = f"gate: {args.candidate} against {args.baseline}"
    else:
        specs = specs_for(args.run, "both", _overrides(args))
        if len(specs) < 2:
            raise UserError(f"gate --run {args.run}: needs a preset with a baseline and an optimized variant")
        resolve_specs(specs)
        if args.out is not None:
            check_writable(args.out)
        results, interrupted = _measure(specs, args)
        if interrupted:
            return EXIT_INTERRUPTED
        checks, pairs = gate_variants(results, thresholds)
        title = f"gate: {args.run}, variants interleaved in one process"
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


def cmd_record(args: argparse.Namespace) -> int:
    from .runs_md import append_rows, check_milestone, format_rows

    milestone = check_milestone(args.milestone)
    groups = [load_results(path) for path in args.files]  # every file checked before anything is written
    if not any(groups):
        raise UserError("record: the result files hold no runs")
    rows = format_rows(milestone, groups)
    append_rows(args.runs_md, rows)
    print(f"appended {len(rows)} row{'s' * (len(rows) != 1)} to {args.runs_md} (milestone {milestone!r})",
          file=sys.stderr)
    return EXIT_OK


def _say(args: argparse.Namespace):  # noqa: ANN202 - a print-to-stderr callable
    return (lambda _text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))


def _with_defaults(args: argparse.Namespace, **defaults: object) -> list[str]:
    """``_overrides`` preceded by command defaults (``run.steps=...``) that the user's options override."""
    return [f"{key}={value}" for key, value in defaults.items()] + _overrides(args)


def cmd_ablate(args: argparse.Namespace) -> int:
    from . import ablate
    from .plots import ablation_chart
    from .results import check_output_dir, write_text_atomic
    from .runner import run_variants

    overrides = _with_defaults(args, **{"run.steps": ablate.ABLATE_DEFAULT_STEPS, "run.repeats": 5})
    only = [name for name in args.flags.split(",") if name.strip()] if args.flags is not None else None
    if only is not None and not only:
        raise UserError("--flags: give at least one flag name, e.g. --flags batch_inference,torch_threads")
    plan = ablate.plan_ablation(args.target, overrides, only)
    expected = ablate.parse_expectations(args.expect, plan)
    out = check_output_dir(args.out or Path(f"ablation-{plan.preset}"))
    specs = ablate.arm_specs(plan, args.target, overrides)
    say = _say(args)
    say(f"ablate {plan.preset}: {len(plan.flags)} flags, {len(specs)} arms interleaved on {plan.device}: "
        + ", ".join(spec.variant for spec in specs))
    runs, interrupted = run_variants(specs, show_progress=not args.quiet and sys.stderr.isatty(), say=lambda _t: None)
    save_results(out / "runs.json", runs)
    if interrupted:
        print(f"rlgauge: interrupted; partial runs written to {out / 'runs.json'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    effects = ablate.flag_effects(plan, runs, expected)
    print(ablate.markdown_table(plan, runs, effects))
    write_text_atomic(out / "ablation.json", json.dumps(ablate.ablation_json(plan, runs, effects), indent=2) + "\n")
    ablation_chart(out / "ablation.png", f"{plan.preset} on {plan.device}: speedup per flag",
                   [e.name for e in effects], [e.alone for e in effects], [e.in_stack for e in effects])
    say(f"ablation written to {out}/ (ablation.json, ablation.png, runs.json)")
    return _status_code(runs)


def cmd_sweep(args: argparse.Namespace) -> int:
    from . import sweep
    from .plots import line_chart
    from .results import check_output_dir, write_text_atomic
    from .runner import run_variants

    params = [sweep.parse_param(text) for text in args.params]
    overrides = _with_defaults(args, **{"run.steps": sweep.SWEEP_DEFAULT_STEPS})
    specs = sweep.sweep_specs(args.target, args.variant, params, overrides)
    preset = specs[0].preset
    out = check_output_dir(args.out or Path(f"sweep-{preset}"))
    _say(args)(f"sweep {preset} ({args.variant}): {len(specs)} points interleaved on {specs[0].config.device}")
    runs, interrupted = run_variants(specs, show_progress=not args.quiet and sys.stderr.isatty(), say=lambda _t: None)
    save_results(out / "runs.json", runs)
    if interrupted:
        print(f"rlgauge: interrupted; partial runs written to {out / 'runs.json'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    points = sweep.points(params, runs)
    device = runs[0].config["device"]
    title = f"Sweep: {preset} ({args.variant}) on {device}"
    print(sweep.markdown_table(title, params, points))
    write_text_atomic(out / "sweep.json", json.dumps(sweep.sweep_json(preset, args.variant, params, points), indent=2) + "\n")
    line_chart(out / "sweep.png", title, params[0].key, list(params[0].values), sweep.series(params, points))
    _say(args)(f"sweep written to {out}/ (sweep.json, sweep.png, runs.json)")
    return _status_code(runs)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from . import diagnose
    from .environment import environment_lines, environment_report
    from .runner import run_variants

    overrides = _with_defaults(args, **{"run.steps": diagnose.DIAGNOSE_DEFAULT_STEPS, "run.repeats": 1})
    (spec,) = specs_for(args.target, args.variant, overrides)
    (resolution,) = resolve_specs([spec])
    text = not args.json
    env_report = environment_report(compile_device=resolution.device.type, check_compile=not args.no_compile_check)
    if text:
        print("## Environment\n" + "\n".join(environment_lines(env_report)), flush=True)
    runs, interrupted = run_variants([spec], show_progress=text and sys.stderr.isatty(), say=lambda _t: None)
    if interrupted:
        return EXIT_INTERRUPTED
    run = runs[0]
    if run.status == "failed":
        raise UserError(f"diagnose {args.target}: the profiled run failed: {run.error}")
    ceiling = diagnose.env_ceiling(resolution.config, resolution.config.run.steps)
    compiled = env_report.get("torch_compile")
    result = diagnose.diagnosis(run, ceiling, None if compiled is None else compiled["works"])
    if args.json:
        print(json.dumps({"environment": env_report, "diagnosis": result}, indent=2))
    else:
        print("\n## Diagnosis\n" + "\n".join(diagnose.diagnosis_lines(result)))
    return _status_code(runs)


def cmd_matrix(args: argparse.Namespace) -> int:
    from . import matrix
    from .results import check_output_dir

    names = None if args.presets is None else [n.strip() for n in args.presets.split(",") if n.strip()]
    if names is not None and not names:
        raise UserError("--presets: give at least one preset name (see 'rlgauge presets')")
    overrides = _with_defaults(args, **{"run.steps": matrix.MATRIX_DEFAULT_STEPS})
    plan = matrix.matrix_specs(names, overrides)
    out = check_output_dir(args.out or Path("rlgauge-matrix"))
    rows, interrupted = matrix.run_matrix(plan, show_progress=not args.quiet and sys.stderr.isatty(), say=_say(args))
    runs = [run for row in rows for run in row.runs]
    save_results(out / "runs.json", runs)
    matrix.write_report(out, rows)
    if interrupted:
        print(f"rlgauge: interrupted; partial report written to {out}/", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(matrix.report_markdown(rows, charts=False))
    _say(args)(f"report written to {out}/ (report.md, report.html, {matrix.SPEEDUP_CHART}, "
               f"{matrix.THROUGHPUT_CHART}, runs.json)")
    return _status_code(runs)


def _status_code(runs: list) -> int:
    bad = [r for r in runs if r.status != "ok"]
    for result in bad:
        print(f"rlgauge: {result.variant} run is {result.status}: {result.error or result.stability}", file=sys.stderr)
    return EXIT_CHECK_FAILED if bad else EXIT_OK


COMMANDS = {"run": cmd_run, "presets": cmd_presets, "config": cmd_config, "compare": cmd_compare,
            "gate": cmd_gate, "record": cmd_record, "ablate": cmd_ablate,
            "sweep": cmd_sweep, "diagnose": cmd_diagnose,
            "matrix": cmd_matrix}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``rlgauge`` and ``python -m harness``; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="rlgauge: %(message)s")
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except (UserError, ConfigError) as exc:
        print(f"rlgauge: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("rlgauge: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # --help / --version
        return int(exc.code or 0)
