"""The device comparison: ``rlgauge run PRESET --device cpu,cuda``.

Each listed device gets its own copy of the variants (named ``VARIANT@DEVICE``), all measured
interleaved in one process by the runner, so the answer to "should I use my GPU for this?" is a
paired ratio, not a guess. ``device: auto`` picks the accelerator (MPS > CUDA > CPU), which is
not always the fastest device for a preset: small batches leave a GPU waiting on kernel launches
and copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from rich.markup import escape
from rich.table import Table

from harness.stats import power
from harness.errors import UserError
from harness.specs.presets import VariantSpec
from harness.stats.compare import CONFIDENCE, Ratio, paired_ratio
from harness.results import RunResult

SEPARATOR = "@"
"""Between a variant's name and its device in a comparison's results (``optimized@cuda``)."""


def device_list(text: str | None) -> list[str] | None:
    """The devices of ``--device A,B`` (each checked to exist here); None for one device (or none)."""
    if text is None or "," not in text:
        return None
    devices = [item.strip() for item in text.split(",")]
    if any(not item for item in devices):
        raise UserError(f"--device {text}: an empty entry in the list; accepted: devices separated by commas, "
                        "e.g. cpu,cuda")
    if "auto" in devices:
        raise UserError(f"--device {text}: 'auto' picks one of the devices a comparison names; list them "
                        "explicitly, e.g. cpu,cuda")
    repeated = next((item for item in devices if devices.count(item) > 1), None)
    if repeated is not None:
        raise UserError(f"--device {text}: {repeated!r} is listed twice; a comparison measures each device once")
    for device in devices:
        check_available(device, text)
    return devices


def check_available(device: str, listed: str) -> None:
    """``UserError`` naming the devices this machine has, unless ``device`` is one of them."""
    from reference_trainers.runtime import device as dev

    base, sep, index = device.partition(":")
    if base not in ("cpu", "cuda", "mps") or (sep and (base != "cuda" or not index.isdigit())):
        raise UserError(f"--device {listed}: {device!r} is not a device; accepted in a list: cpu, cuda, cuda:N, mps")
    try:
        dev.resolve_device(device)
    except dev.DeviceError:
        raise UserError(f"--device {listed}: {device!r} is not available on this machine; available here: "
                        f"{', '.join(dev.available_devices())}") from None


def specs_on_devices(devices: list[str], specs_for_device: Callable[[str], list[VariantSpec]]) -> list[VariantSpec]:
    """Each device's specs, their variants renamed ``VARIANT@DEVICE``, device by device."""
    return [replace(spec, variant=f"{spec.variant}{SEPARATOR}{device}")
            for device in devices for spec in specs_for_device(device)]


def split_variant(name: str) -> tuple[str, str | None]:
    """``optimized@cuda`` -> (``optimized``, ``cuda``); a name without a device -> (name, None)."""
    variant, sep, device = name.rpartition(SEPARATOR)
    return (variant, device) if sep else (name, None)


def _rate(block: dict[str, Any] | None) -> str:
    return "-" if block is None else f"{block['median']:,.0f} [{block['min']:,.0f}-{block['max']:,.0f}]"


def verdict(first: str, other: str, ratio: Ratio | None) -> str:
    """Which device wins for a variant, from the paired ratio ``other / first`` and its interval."""
    if ratio is None:
        return "-"
    if not power.has_power(ratio.n):
        return power.no_verdict(ratio.n)
    note = power.resolution_note(ratio)
    if ratio.low > 1.0:
        return f"{other}, {ratio.value:.2f}x ({note})"
    if ratio.high < 1.0:
        return f"{first}, {1.0 / ratio.value:.2f}x ({note})"
    return f"within noise ({note})"


def _paired(first: RunResult | None, other: RunResult | None) -> Ratio | None:
    if first is None or other is None or first.status != "ok" or other.status != "ok":
        return None
    return paired_ratio(first.metrics["env_steps_per_sec"]["samples"], other.metrics["env_steps_per_sec"]["samples"])


def comparison_table(results: list[RunResult]) -> Table:
    """One row per variant: env steps/s on each device, the ratio to the first device, the winner."""
    by_variant: dict[str, dict[str, RunResult]] = {}
    devices: list[str] = []
    for result in results:
        variant, device = split_variant(result.variant)
        if device is None:
            continue
        by_variant.setdefault(variant, {})[device] = result
        if device not in devices:
            devices.append(device)
    first = devices[0] if devices else "-"
    table = Table(title=f"{results[0].preset}: env steps/s by device, measured interleaved (paired per-repeat ratios)")
    table.add_column("variant")
    for device in devices:
        table.add_column(device, justify="right")
    for device in devices[1:]:
        table.add_column(f"{device}/{first} ({CONFIDENCE:.0%} CI)", justify="right")
    table.add_column("faster", justify="right")
    for variant, runs in by_variant.items():
        rates = [_rate(runs[d].metrics.get("env_steps_per_sec") if d in runs and runs[d].status == "ok" else None)
                 for d in devices]
        ratios = [_paired(runs.get(first), runs.get(device)) for device in devices[1:]]
        cells = ["-" if r is None else f"{r.value:.2f}x [{r.low:.2f}-{r.high:.2f}]" for r in ratios]
        verdicts = [verdict(first, device, r) for device, r in zip(devices[1:], ratios)]
        table.add_row(escape(variant), *rates, *cells, escape("; ".join(verdicts)))
    return table
