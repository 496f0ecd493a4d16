"""The one trainer variant ``rlgauge diagnose`` and ``rlgauge try`` take, shared by both commands (neither imports the
other's module for it)."""

from __future__ import annotations

import argparse

from harness.cli.options import user_overrides
from harness.errors import UserError


def diagnose_spec(args: argparse.Namespace) -> tuple:
    """The one variant ``diagnose`` takes (a preset's, a file's or ``--trainer``'s) and how to name it."""
    from harness.analyses.diagnose import DIAGNOSE_DEFAULT_STEPS
    from harness.specs.presets import load_preset, own_trainer_preset, specs_of

    overrides = [f"run.steps={DIAGNOSE_DEFAULT_STEPS}", *user_overrides(args)]  # the user's options override it
    if args.trainer is not None:
        if args.target is not None:
            raise UserError(f"diagnose: with --trainer, give the settings file as --config {args.target} (not as a "
                            "positional argument)")
        preset = own_trainer_preset(args.trainer, args.config)
        target = f"--trainer {args.trainer}" + (f" --config {args.config}" if args.config else "")
    else:
        if args.config is not None:
            raise UserError("--config: only used with --trainer; a preset or config file is given as PRESET|FILE.yaml")
        target = args.target or "ppo-cartpole"
        preset = load_preset(target)
    names = list(preset.variants)
    variant = args.variant or ("baseline" if "baseline" in names else names[0])
    if variant not in names:
        raise UserError(f"--variant {variant}: {preset.name} has no such variant; accepted: {', '.join(names)}")
    specs = specs_of(preset, variant, overrides)
    return specs[0], target
