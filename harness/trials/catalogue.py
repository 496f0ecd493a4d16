"""The changes ``rlgauge try`` knows: each changes one thing, says what it does to the maths, and names
the diagnosis rules (``harness.diagnosis.recommendations``) whose finding selects it.

A ``runtime`` change is applied in the trainer's own process around its factory (``runtime_patches``);
a ``source`` change edits copies of the user's files at the lines the diagnosis found (``source_edits``).
Changes of one ``group`` are alternatives: the combination keeps the fastest of them.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNTIME, SOURCE = "runtime", "source"
A_A = "no_change"
"""The A/A arm: in every try, the machine's noise floor for the trainer; never a member of the combination."""


@dataclass(frozen=True)
class Change:
    name: str
    kind: str
    """``runtime`` or ``source``."""
    does: str
    """What is changed, in one line."""
    maths: str
    """What it does to the maths, in one line."""
    rules: tuple[str, ...] = ()
    """The diagnosis rules whose finding selects it; none: only ``--only`` selects it."""
    cuda_only: bool = False
    group: str | None = None
    code: tuple[str, ...] = ()
    """Lines for the factory's first lines in ``--patch`` (``{torch}``: the module's name for torch)."""
    always: bool = False
    """Tried on every trainer, whatever fired: a setting whose effect no finding predicts."""
    slow_start: bool = False
    """Its process takes far longer to be ready (it compiles): started first, while the others share the rest."""


CHANGES: dict[str, Change] = {c.name: c for c in (
    Change(A_A, RUNTIME, "nothing: an arm identical to the unchanged one (the A/A check: this machine's noise floor "
           "for this trainer)", "none", always=True),
    Change("threads_1", RUNTIME, "torch.set_num_threads(1) after the factory",
           "the same ops; a CPU reduction may be split differently, so the last bits may differ",
           ("threads",), code=("{torch}.set_num_threads(1)",), always=True),
    Change("fused_optimizer", RUNTIME, "torch.optim optimizers built with fused=True (foreach=True where fused "
           "does not run on the device or the class has none)",
           "the same update rule in one kernel over all parameters; rounding may differ in the last bits",
           ("forloop_optimizer",), group="optimizer"),
    Change("foreach_optimizer", RUNTIME, "torch.optim optimizers built with foreach=True",
           "the same update rule over lists of tensors; rounding may differ in the last bits", group="optimizer"),
    Change("no_validate_args", RUNTIME, "torch.distributions.Distribution.set_default_validate_args(False) before "
           "the factory", "none: the checks only raise on invalid arguments", ("distribution_checks",),
           group="validate", code=("{torch}.distributions.Distribution.set_default_validate_args(False)",)),
    Change("validate_args_off", SOURCE, "validate_args=False in the distribution built at the lines whose checks "
           "sync", "none: the checks only raise on invalid arguments", ("distribution_checks",), group="validate"),
    Change("float32_at_source", SOURCE, "dtype=torch.float32 (or .astype(np.float32)) where float64 enters",
           "the values are rounded to float32 where they enter instead of a float64 tensor being cast later",
           ("float64",)),
    Change("no_grad_acting", SOURCE, "the acting forward at the line found, under torch.no_grad()",
           "none: the same forward without recording its graph (a backward through it would raise)",
           ("acting_builds_graph",)),
    Change("compile_modules", RUNTIME, "every top-level nn.Module the factory built (a holder without forward: its "
           "children) compiled once built; torch's compiler also turns distribution argument checks off in the process",
           "the same ops fused by the compiler; rounding may differ in the last bits", ("uncompiled_update",),
           slow_start=True),
    Change("autocast_bf16", RUNTIME, "the forward of each module called outermost while grad is enabled (the update's "
           "forwards, whatever method calls them; not acting under no_grad) under torch.autocast(device type, "
           "dtype=torch.bfloat16), its floating outputs cast back to float32; the loss and optimizer step outside",
           "the forwards' matmuls and convolutions in bfloat16 (8-bit mantissa): results change", ("cuda_update",),
           always=True),
    Change("matmul_precision", RUNTIME, "torch.set_float32_matmul_precision('high'): float32 matmuls in TF32",
           "float32 matmuls with TF32's 10-bit mantissa: results change slightly", ("cuda_update",), cuda_only=True,
           code=("{torch}.set_float32_matmul_precision('high')",)),
    Change("cudnn_benchmark", RUNTIME, "torch.backends.cudnn.benchmark = True",
           "cuDNN may pick other convolution algorithms: the last bits may differ", cuda_only=True,
           code=("{torch}.backends.cudnn.benchmark = True",)),
)}

NAMES = tuple(CHANGES)


def changes_for_rule(rule: str) -> list[str]:
    """The changes this catalogue makes for a diagnosis rule (``rlgauge try --only`` in diagnose's check line)."""
    return [change.name for change in CHANGES.values() if rule in change.rules]


def accepted() -> str:
    """The names ``--only`` accepts, comma-separated."""
    return ", ".join(NAMES)
