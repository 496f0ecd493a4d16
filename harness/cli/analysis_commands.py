"""The analysis commands: ``ablate``, ``sweep``, ``diagnose``, ``matrix``, ``calibrate``, ``asv-calibrate``,
``learn`` (parsers and ``cmd_*``).

Each command is short and calls one module (``ablate.py``, ``sweep.py``, ``diagnose.py``,
``matrix.py``, ``learn.py``); all take the run options and turn bad input into ``UserError`` (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.campaigns.executors import parse_executor
from harness.campaigns.outcome import run_arms, save_runs, status_code
from harness.cli.diagnose_spec import diagnose_spec
from harness.cli.options import (DEVICE_HELP, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK, note_trainer_output,
                                 quiet_option, run_options, trainer_output, user_overrides)
from harness.errors import UserError
from harness.analyses.learn import DEFAULT_SEEDS, DEFAULT_STEPS, MIN_SEEDS
from harness.analyses.learn_verdicts import DEFAULT_MARGIN_PCT
from harness.specs.presets import VARIANTS
from harness.specs.run_size import MAX_ENV_STEPS, MAX_RUNS, check_size, size_of

_YES_HELP = (f"run even above the size limit ({MAX_RUNS} runs or {MAX_ENV_STEPS:,} env steps in all); "
             "without it a larger command is refused with its size and a time estimate")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """ablate, sweep, diagnose, matrix: the analysis commands (each takes the run options)."""
    ablate = sub.add_parser("ablate", help="attribute the speedup to each optimisation flag (all arms interleaved)",
                            description="Attribute a preset's speedup to each optimisation flag: each flag alone on "
                                        "the baseline and each left out of the full stack, all arms interleaved in "
                                        "one process, with paired ratios and their intervals.")
    ablate.add_argument("target", metavar="PRESET|FILE.yaml",
                        help="a preset name (see 'rlgauge presets') or a YAML config file")
    ablate.add_argument("--flags", metavar="a,b,...", help="only these flags (default: every flag the variants differ in)")
    ablate.add_argument("--expect", metavar="FLAG=1.5x,...", help="expected speedup of flags alone, shown beside the measured one")
    run_options(ablate, steps_default="8192 for ablate", repeats_default="5 for ablate")
    ablate.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: ablation-PRESET/)")
    ablate.add_argument("--quiet", action="store_true", help="no progress bar or optimisation summary")
    ablate.add_argument("--effects", type=Path, metavar="FILE.json",
                        help="also record each flag's measured speedup in this reference-effects data file, "
                             "replacing its entries for the same preset, device kind and flag (a shipped preset "
                             "only; rlgauge's own file, which 'rlgauge diagnose' quotes, is "
                             "harness/diagnosis/reference_effects.json)")

    sweep = sub.add_parser("sweep", help="throughput across values of a config key (two --param: a grid), interleaved",
                           description="Measure throughput across the values of a config key (a second --param "
                                       "makes a grid), every point interleaved in one process; writes a table, "
                                       "a chart and the runs.")
    sweep.add_argument("target", metavar="PRESET|FILE.yaml",
                       help="a preset name (see 'rlgauge presets') or a YAML config file")
    sweep.add_argument("--param", dest="params", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a dotted config key and its values, each parsed like --set; a second --param makes a grid")
    sweep.add_argument("--variant", choices=VARIANTS, default="optimized", help="the variant swept (default: optimized)")
    run_options(sweep, steps_default="8192 for sweep")
    sweep.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: sweep-PRESET/)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument("--yes", action="store_true", help=_YES_HELP)
    _executor_option(sweep, "the sweep (one job: its points interleaved on one machine)")

    diagnose = sub.add_parser("diagnose", help="where a trainer's time goes and the lines that cost it (a preset "
                              "or your own trainer), with recommendations",
                              description="Report the machine, then diagnose a preset's variant or your own trainer "
                                          "with no instrumentation: the phase split found by torch's global hooks, "
                                          "host syncs and float64 ops with their source lines, the loop's shape, "
                                          "and the optimisations that address what was found. A separate run from "
                                          "any timed figure.")
    diagnose.add_argument("target", nargs="?", default=None, metavar="PRESET|FILE.yaml",
                          help="what to diagnose (default: ppo-cartpole; a file may name your trainer with trainer:)")
    diagnose.add_argument("--trainer", metavar="MODULE:ATTRIBUTE",
                          help="diagnose your own trainer: a factory make_trainer(config, *, device, seed)")
    diagnose.add_argument("--config", type=Path, metavar="FILE.yaml",
                          help="with --trainer: its settings (config:, variants:, run:), or a plain mapping of them")
    diagnose.add_argument("--variant", default=None,
                          help="the variant diagnosed (default: baseline, or a file's only variant)")
    run_options(diagnose, steps_default="4096 for diagnose", repeats_default="not used by diagnose")
    diagnose.add_argument("--json", action="store_true", help="print one JSON object instead of text (stdout holds "
                          "it alone: the trainer's own stdout goes to stderr, or to a file under --quiet)")
    quiet_option(diagnose, "rlgauge-diagnose")
    diagnose.add_argument("--try", dest="try_changes", action="store_true",
                          help="your own trainer: then try each change the recommendations name (rlgauge try, with "
                               "its default rounds; docs/try.md)")
    diagnose.add_argument("--compile-check", action="store_true",
                          help="also try torch.compile on a tiny function on the device (seconds; off by default)")
    diagnose.add_argument("--no-compile-check", dest="compile_check", action="store_false",
                          help=argparse.SUPPRESS)  # the default now; still accepted
    diagnose.set_defaults(compile_check=False)

    matrix = sub.add_parser("matrix", help="every preset, both variants: one Markdown + HTML report with charts",
                            description="Measure both variants of every preset (or of --presets), then write one "
                                        "Markdown and HTML report with the speedups, charts and stability.")
    matrix.add_argument("--presets", metavar="a,b,...", help="only these presets (default: all)")
    run_options(matrix, steps_default="8192 for matrix")
    matrix.add_argument("--out", type=Path, metavar="DIR", help="report folder (default: rlgauge-matrix/)")
    matrix.add_argument("--quiet", action="store_true", help="no progress bar or per-preset lines")
    matrix.add_argument("--yes", action="store_true", help=_YES_HELP)
    _executor_option(matrix, "the presets (one job each: a preset's variants interleaved on one machine)")

    calibrate = sub.add_parser("calibrate", help="the throughput gate's false alarms and detection rate on this "
                               "machine (A/A and planted slowdowns, interleaved); recommends --repeats and --max-slowdown",
                              description="Measure the throughput gate's false alarms (A/A runs) and detection rate "
                                          "(planted slowdowns) on this machine, and recommend --repeats and "
                                          "--max-slowdown for it.")
    calibrate.add_argument("target", nargs="?", default="ppo-cartpole", metavar="PRESET|FILE.yaml",
                           help="what to measure (default: ppo-cartpole)")
    calibrate.add_argument("--variant", choices=VARIANTS, default="optimized", help="the variant measured (default: optimized)")
    calibrate.add_argument("--trials", type=int, default=100, help="trials at the largest --repeats-grid value (default: 100)")
    calibrate.add_argument("--repeats-grid", default="3,5,7,9", metavar="R1,R2,...",
                           help="repeats per gated run to evaluate, each >= 3 (default: 3,5,7,9)")
    calibrate.add_argument("--thresholds-grid", default="5,10,15,20", metavar="T1,T2,...",
                           help="--max-slowdown percentages to evaluate (default: 5,10,15,20)")
    calibrate.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                           help="override a config value (repeatable)")
    calibrate.add_argument("--device", help="auto | cpu | cuda[:N] | mps (default: the preset's)")
    calibrate.add_argument("--steps", type=int, help="timed env steps of each round (default: 2048)")
    calibrate.add_argument("--seed", type=int, help="random seed")
    calibrate.set_defaults(repeats=None)  # rounds come from --trials and --repeats-grid
    calibrate.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: calibrate-PRESET/)")
    calibrate.add_argument("--quiet", action="store_true", help="no progress bar or time estimate")

    asv_calibrate = sub.add_parser(
        "asv-calibrate", help="the A/A spread of the gated asv suite on this machine; recommends asv's --factor",
        description="Run asv continuous --runs times between a commit and a twin with the same tree (made with git "
                    "commit-tree; no branch or file changes), apply asv's own rule to every benchmark, and recommend "
                    "the factor for make asv-continuous (ASV_FACTOR) with the false alarms at --factor.")
    asv_calibrate.add_argument("--runs", type=int, default=5, help="A/A runs of asv continuous (default: 5)")
    asv_calibrate.add_argument("--base", default="HEAD", metavar="REF", help="the commit measured (default: HEAD)")
    asv_calibrate.add_argument("--bench", default=None, metavar="REGEX",
                               help="asv's -b: the benchmarks (default: the gated set of make asv-continuous)")
    asv_calibrate.add_argument("--factor", type=float, default=None,
                               help="the factor whose false alarms are counted (default: make asv-continuous's)")
    asv_calibrate.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: asv-calibration/)")
    asv_calibrate.add_argument("--quiet", action="store_true", help="no line per run")

    learn = sub.add_parser("learn", help="learning curves of a trainer's variants (and a peer) over seeds, with verdicts",
                           description="Train a preset's baseline and optimized variants (or your trainer's "
                                       "variants, or several presets at once; a peer library with --peer) "
                                       "interleaved, over several seeds, and write their learning curves, a chart "
                                       "and verdicts: the interquartile-mean difference in final return and in area "
                                       "under the curve with its stratified bootstrap interval, judged against a "
                                       "margin ('same learning', 'learns less', 'learns more' or 'inconclusive'). "
                                       "Exit 1 when a comparison learns less (--strict: or is inconclusive).")
    learn.add_argument("target", nargs="?", metavar="PRESET[,PRESET...]|FILE.yaml",
                       help="presets (see 'rlgauge presets'; several are pooled with normalised scores) or a YAML "
                            "file with baseline and optimized variants, or naming your trainer: MODULE:ATTRIBUTE")
    learn.add_argument("--trainer", metavar="MODULE:ATTRIBUTE",
                       help="learn with your own trainer: a factory make_trainer(config, *, device, seed) whose "
                            "trainer has mean_recent_return() (docs/own-trainer.md)")
    learn.add_argument("--config", type=Path, metavar="FILE.yaml", help="with --trainer: its settings and variants")
    learn.add_argument("--peer", metavar="NAME", help="also train a peer library on matched settings (sb3: "
                       "Stable-Baselines3; needs pip install 'rlgauge[peers]')")
    learn.add_argument("--seeds", type=int, default=DEFAULT_SEEDS, metavar="N",
                       help=f"seeds per arm, --seed .. --seed+N-1 (default: {DEFAULT_SEEDS}; at least {MIN_SEEDS}, "
                            "and 3 for a verdict)")
    learn.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="S",
                       help=f"env steps each arm trains for, per seed (default: {DEFAULT_STEPS:,})")
    learn.add_argument("--seed", type=int, default=1, metavar="FIRST", help="the first seed (default: 1)")
    learn.add_argument("--margin", metavar="PCT|METRIC=PCT,...",
                       help="'same learning' needs the whole interval within +-PCT %% of the second arm's score "
                            f"(default: {', '.join(f'{m} {v:g}' for m, v in DEFAULT_MARGIN_PCT.items())}; "
                            "docs/analysis.md says how they were measured)")
    learn.add_argument("--strict", action="store_true", help="also exit 1 when a comparison is inconclusive")
    _executor_option(learn, "the seeds (one job each: a seed with all its arms on one machine)")
    learn.add_argument("--cpus-per-job", type=int, default=1, metavar="N",
                       help="whole CPUs each Ray task holds; torch's threads in it are capped to them (default: 1)")
    learn.add_argument("--from", dest="from_file", type=Path, metavar="learn.json",
                       help="judge a recorded campaign again (e.g. with another --margin) instead of training")
    learn.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value of every arm, e.g. --set env.num_envs=8 (repeatable)")
    learn.add_argument("--device", help=DEVICE_HELP)
    learn.set_defaults(repeats=None)  # seeds, not repeats
    learn.add_argument("--out", type=Path, metavar="DIR", help="output folder (default: learn-PRESET/)")
    learn.add_argument("--quiet", action="store_true", help="no progress bar or summary lines")


def _executor_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--executor", metavar="local|ray[:ADDRESS]", default="local",
                        help=f"where {what} run: here, one after another (default), or as Ray tasks on a local Ray or "
                             "the cluster at ADDRESS (needs pip install 'rlgauge[ray]'; docs/campaigns.md)")


def _say(args: argparse.Namespace):  # noqa: ANN202 - a print-to-stderr callable
    return (lambda _text: None) if args.quiet else (lambda text: print(text, file=sys.stderr))


def _with_defaults(args: argparse.Namespace, **defaults: object) -> list[str]:
    """``_overrides`` preceded by command defaults (``run.steps=...``) that the user's options override."""
    return [f"{key}={value}" for key, value in defaults.items()] + user_overrides(args)


def cmd_ablate(args: argparse.Namespace) -> int:
    from harness.analyses import ablate
    from harness.report.plots import ablation_chart
    from reference_trainers.state.atomic_file import write_text_atomically

    from harness.results import check_output_dir

    overrides = _with_defaults(args, **{"run.steps": ablate.ABLATE_DEFAULT_STEPS, "run.repeats": 5})
    only = [name for name in args.flags.split(",") if name.strip()] if args.flags is not None else None
    if only is not None and not only:
        raise UserError("--flags: give at least one flag name, e.g. --flags batch_inference,torch_threads")
    plan = ablate.plan_ablation(args.target, overrides, only)
    expected = ablate.parse_expectations(args.expect, plan)
    if args.effects is not None:
        _check_effects_target(args)
    out = check_output_dir(args.out or Path(f"ablation-{plan.preset}"),
                           files=("runs.json", "ablation.json", "ablation.png"))
    specs = ablate.arm_specs(plan, args.target, overrides)
    say = _say(args)
    say(f"ablate {plan.preset}: {len(plan.flags)} flags, {len(specs)} arms interleaved on {plan.device}: "
        + ", ".join(spec.variant for spec in specs))
    _note_no_power(specs, "the verdicts")
    runs, interrupted = run_arms(specs, show_progress=not args.quiet and sys.stderr.isatty())
    stopped = save_runs(out, runs, interrupted)
    if stopped is not None:
        return stopped
    effects = ablate.flag_effects(plan, runs, expected)
    print(ablate.markdown_table(plan, runs, effects))
    data = ablate.ablation_json(plan, runs, effects)
    write_text_atomically(out / "ablation.json", json.dumps(data, indent=2) + "\n")
    ablation_chart(out / "ablation.png", f"{plan.preset} on {plan.device}: speedup per flag",
                   [e.name for e in effects], [e.alone for e in effects], [e.in_stack for e in effects])
    say(f"ablation written to {out}/ (ablation.json, ablation.png, runs.json)")
    if args.effects is not None:
        from harness.diagnosis import reference_effects

        entries = reference_effects.entries_from_ablation(data, user_overrides(args))
        added, replaced = reference_effects.record_effects(args.effects, entries)
        say(f"reference effects: {added} added, {replaced} replaced in {args.effects} ({plan.preset} on "
            f"{reference_effects.device_kind(plan.device)})")
    return status_code(runs)


def _check_effects_target(args: argparse.Namespace) -> None:
    """``ablate --effects``: a shipped preset (the figures are the reference trainers') and a file that
    reads as reference effects and may be written, both checked before anything is measured."""
    from harness.diagnosis.reference_effects import check_effects_file
    from harness.specs.presets import load_preset, preset_names

    if args.target not in preset_names() or load_preset(args.target).trainer is not None:
        raise UserError(f"--effects: records the figures of rlgauge's own trainers on a shipped preset "
                        f"(see 'rlgauge presets'); {args.target!r} is not one")
    check_effects_file(args.effects)


def cmd_sweep(args: argparse.Namespace) -> int:
    from harness.analyses import sweep
    from harness.report.plots import sweep_chart
    from reference_trainers.state.atomic_file import write_text_atomically

    from harness.results import check_output_dir

    params = [sweep.parse_param(text) for text in args.params]
    overrides = _with_defaults(args, **{"run.steps": sweep.SWEEP_DEFAULT_STEPS})
    smaller = "fewer --param values, --steps or --repeats"
    if sweep.grid_size(params) > MAX_RUNS and not args.yes:  # refused before 10,000 points are built
        check_size("sweep", sweep.extrapolated_size(args.target, args.variant, params, overrides), False,
                   _say(args), smaller)
    specs = sweep.sweep_specs(args.target, args.variant, params, overrides)
    check_size("sweep", size_of(spec.config for spec in specs), args.yes, _say(args), smaller)
    preset = specs[0].preset
    out = check_output_dir(args.out or Path(f"sweep-{preset}"), files=("runs.json", "sweep.json", "sweep.png"))
    from harness.measurement.runner import resolve_specs

    device = resolve_specs(specs[:1])[0].device
    executor = parse_executor(args.executor)
    _say(args)(f"sweep {preset} ({args.variant}): {len(specs)} points interleaved on {device}, executor {args.executor}")
    if len(params) > 1:
        _note_no_power(specs, "the fastest point of each row")
    # one job: every point of the sweep interleaved on one machine
    runs, interrupted = run_arms(specs, executor, show_progress=not args.quiet and sys.stderr.isatty(),
                                 name=f"sweep {preset}")
    stopped = save_runs(out, runs, interrupted)
    if stopped is not None:
        return stopped
    points = sweep.points(params, runs)
    title = f"Sweep: {preset} ({args.variant}) on {device}"
    print(sweep.markdown_table(title, params, points))
    write_text_atomically(out / "sweep.json", json.dumps(sweep.sweep_json(preset, args.variant, params, points), indent=2) + "\n")
    sweep_chart(out / "sweep.png", title, params[0].key, list(params[0].values), sweep.series(params, points))
    _say(args)(f"sweep written to {out}/ (sweep.json, sweep.png, runs.json)")
    return status_code(runs)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from harness.analyses import diagnose
    from harness.diagnosis.report import report_lines
    from harness.measurement.environment import environment_lines, environment_report
    from harness.measurement.runner import resolve_specs

    spec, target = diagnose_spec(args)
    if getattr(args, "try_changes", False):
        _check_try(spec, target)
    (resolution,) = resolve_specs([spec])
    text = not args.json
    env_report = environment_report(compile_device=resolution.device.type, check_compile=args.compile_check)
    if text:
        print("## Environment\n" + "\n".join(environment_lines(env_report)), flush=True)
    output = None
    try:
        with trainer_output(args.quiet, "rlgauge-diagnose") as output:  # the trainer's own output stays out
            result = diagnose.diagnose(spec, resolution, target)
    except diagnose.DiagnosisFailed as failed:
        note_trainer_output(output)
        if failed.partial:
            _print_diagnosis(args, env_report, failed.partial, report_lines)
        print(f"rlgauge: {failed}", file=sys.stderr)
        return EXIT_CHECK_FAILED
    except KeyboardInterrupt:
        note_trainer_output(output)
        return EXIT_INTERRUPTED
    note_trainer_output(output)
    _print_diagnosis(args, env_report, result, report_lines)
    if getattr(args, "try_changes", False):
        return _try_after(args, spec, resolution, target, result)
    return EXIT_OK


def _check_try(spec: object, target: str) -> None:
    """``--try`` takes a user's own trainer: a preset is refused before anything runs."""
    from harness.specs.own_trainer import OwnConfig

    if not isinstance(spec.config, OwnConfig):  # type: ignore[attr-defined]
        raise UserError(f"diagnose {target} --try: rlgauge's presets have their flags measured by rlgauge ablate; "
                        "accepted: your own trainer (FILE.yaml with trainer:, or --trainer)")


def _try_after(args: argparse.Namespace, spec: object, resolution: object, target: str, result: dict) -> int:
    """``diagnose --try``: the recommendations' changes tried on the user's trainer (``rlgauge try``'s trials)."""
    from harness.cli.try_command import try_changes
    from harness.trials.parity import DEFAULT_ITERATIONS
    from harness.trials.rounds import DEFAULT_ROUNDS

    args.rounds, args.parity_iterations, args.patch = DEFAULT_ROUNDS, DEFAULT_ITERATIONS, None
    args.quiet = getattr(args, "quiet", False)
    print("\n## Trying the changes", flush=True)
    return try_changes(args, spec, resolution, target, result, None)


def _print_diagnosis(args: argparse.Namespace, env_report: dict, result: dict, report_lines: object) -> None:
    if args.json:
        print(json.dumps({"environment": env_report, "diagnosis": result}, indent=2))
    else:
        print("\n## Diagnosis\n" + "\n".join(report_lines(result)))  # type: ignore[operator]


def cmd_matrix(args: argparse.Namespace) -> int:
    from harness.analyses import matrix
    from harness.results import check_output_dir

    names = None if args.presets is None else [n.strip() for n in args.presets.split(",") if n.strip()]
    if names is not None and not names:
        raise UserError("--presets: give at least one preset name (see 'rlgauge presets')")
    overrides = _with_defaults(args, **{"run.steps": matrix.MATRIX_DEFAULT_STEPS})
    plan = matrix.matrix_specs(names, overrides)
    executor = parse_executor(args.executor)
    check_size("matrix", size_of(spec.config for specs in plan.values() for spec in specs), args.yes, _say(args),
               "fewer --presets, --steps or --repeats")
    out = check_output_dir(args.out or Path("rlgauge-matrix"), files=("runs.json", "report.md", "report.html",
                                                                   matrix.SPEEDUP_CHART, matrix.THROUGHPUT_CHART))
    rows, interrupted = matrix.run_matrix(plan, show_progress=not args.quiet and sys.stderr.isatty(), say=_say(args),
                                          executor=executor)
    runs = [run for row in rows for run in row.runs]
    matrix.write_report(out, rows)
    stopped = save_runs(out, runs, interrupted, what="partial report")
    if stopped is not None:
        return stopped
    print(matrix.report_markdown(rows, charts=False))
    _say(args)(f"report written to {out}/ (report.md, report.html, {matrix.SPEEDUP_CHART}, "
               f"{matrix.THROUGHPUT_CHART}, runs.json)")
    return status_code(runs)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from harness.analyses.calibrate import run_command

    return run_command(args)


def cmd_asv_calibrate(args: argparse.Namespace) -> int:
    from harness.integrations import asv_calibrate

    args.bench = asv_calibrate.GATED if args.bench is None else args.bench
    args.factor = asv_calibrate.FACTOR if args.factor is None else args.factor
    return asv_calibrate.run_command(args)


def cmd_learn(args: argparse.Namespace) -> int:
    from harness.analyses import learn, learn_report
    from harness.analyses.learn_verdicts import no_verdict, parse_margins
    from harness.measurement.interrupts import stop_on_signals
    from harness.stats.power import MIN_REPEATS
    from harness.results import check_output_dir

    margins = parse_margins(args.margin)
    say = _say(args)
    if args.from_file is not None:
        data = learn_report.judge(learn_report.load_summary(args.from_file), margins)
        print(learn_report.markdown(data), end="")
        return _learn_exit(data, args, [])
    if args.cpus_per_job < 1:
        raise UserError(f"--cpus-per-job {args.cpus_per_job}: accepted: a whole number of CPUs, 1 or more")
    executor = parse_executor(args.executor, fresh_processes=True)  # no seed's curves depend on the seeds before
    # learn's --steps and --seed are its budget and first seed, not run.steps and seed
    overrides = user_overrides(argparse.Namespace(**{**vars(args), "steps": None, "seed": None}))
    plans = learn.plan_campaign(args.target, overrides, peer=args.peer, seeds=args.seeds, steps=args.steps,
                                first_seed=args.seed, trainer=args.trainer, config=args.config)
    name = ",".join(plan.preset for plan in plans)
    out = check_output_dir(args.out or Path(f"learn-{name.replace(',', '+')}"), files=learn_report.FILES)
    plan = plans[0]
    say(f"learn {name}: {', '.join(arm.name for arm in plan.arms)} interleaved, {len(plan.seeds)} seeds x "
        f"{plan.steps:,} env steps each, on {plan.arms[0].resolutions[0].device}, executor {args.executor}")
    if len(plan.seeds) < MIN_REPEATS:
        print(f"rlgauge: note: the verdicts will read '{no_verdict(len(plan.seeds))}'; learn with --seeds "
              f"{MIN_REPEATS} or more", file=sys.stderr)
    with stop_on_signals() as signals:  # Ctrl-C: stop, then write what was recorded (not cut short)
        record = learn.run_campaign(plans, executor, cpus_per_job=args.cpus_per_job,
                                    on_seed=lambda job, _result: say(f"learn: {job.name} done"))
        signals.hold()
        data = learn_report.summary(plans, record, margins)
        learn_report.write_outputs(out, data)
    print(learn_report.markdown(data), end="")
    if record.interrupted:
        print(f"rlgauge: interrupted; what was recorded is written to {out}/", file=sys.stderr)
        return EXIT_INTERRUPTED
    say(f"learning written to {out}/ ({', '.join(learn_report.FILES)})")
    for reason in record.quality.get("reasons", []):
        print(f"rlgauge: warning: {name}: wall seconds not trustworthy: {reason}", file=sys.stderr)
    return _learn_exit(data, args, plan.seeds)


def _learn_exit(data: dict, args: argparse.Namespace, seeds: list[int]) -> int:
    """Exit 1 on "learns less" (``--strict``: also on inconclusive) or a failed run, naming them."""
    from harness.analyses import learn_report

    failed = learn_report.failed_verdicts(data, strict=args.strict)
    if failed:
        print(f"rlgauge: {'not shown alike' if args.strict else 'learns less'}: {'; '.join(failed)}", file=sys.stderr)
        if seeds:
            print(f"rlgauge: note: a batch of seeds can be lucky or not; before calling a gap real, check it on "
                  f"other seeds: --seed {seeds[-1] + 1} --seeds {len(seeds)}", file=sys.stderr)
    return EXIT_CHECK_FAILED if failed or learn_report.failed_curves(data) else EXIT_OK  # failed runs were logged


def _note_no_power(specs: list, what: str) -> None:
    """Before measuring: say so when the repeats are too few for ``what`` (ablate, sweep)."""
    from harness.stats.power import MIN_REPEATS, has_power, no_verdict

    repeats = min(spec.config.run.repeats for spec in specs)
    if not has_power(repeats):
        print(f"rlgauge: note: {what} will read '{no_verdict(repeats)}'; measure with --repeats {MIN_REPEATS} "
              "or more", file=sys.stderr)


COMMANDS = {"ablate": cmd_ablate, "sweep": cmd_sweep, "diagnose": cmd_diagnose, "matrix": cmd_matrix,
            "calibrate": cmd_calibrate, "asv-calibrate": cmd_asv_calibrate, "learn": cmd_learn}
