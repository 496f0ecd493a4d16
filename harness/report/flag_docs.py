"""The flag reference (``docs/flags.md``), generated from the flag registry.

``python -m harness.report.flag_docs > docs/flags.md`` rewrites it; a test fails when the file is stale.
"""

from __future__ import annotations

from typing import Any

from reference_trainers.config.flags import (ALGORITHM, ALGOS, BODIES, CLASS_PROMISES, DEVICES, FLAGS, OPTIMISATION,
                                             SETTING, TUNINGS, Flag)

ROLE_TITLES = {OPTIMISATION: "Optimisations", SETTING: "Settings of an optimisation", ALGORITHM: "Algorithm options"}


def _value(value: Any) -> str:
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def _scope(entry: Flag) -> str:
    parts = []
    if entry.algos != ALGOS:
        parts.append("/".join(entry.algos))
    if entry.devices != DEVICES:
        parts.append("/".join(entry.devices))
    if entry.bodies != BODIES:
        parts.append(f"{'/'.join(entry.bodies)} body")
    return ", ".join(parts) or "all"


def _section(entry: Flag) -> list[str]:
    classes = entry.parity + "".join(f"; `{v}`: {c}" for v, c in entry.parity_by_value.items())
    lines = [
        f"### `{entry.key}`",
        "",
        f"- **plain** (`{_value(entry.plain)}`): {entry.plain_path}",
        f"- **optimised** (`{'`, `'.join(_value(v) for v in entry.optimised)}`): {entry.optimised_path}",
        f"- **optimized presets**: `{_value(entry.preset)}`" + (" (resolved per device and config)"
                                                               if entry.preset == "auto" else ""),
        f"- **applies to**: {_scope(entry)}; **phase**: {entry.phase}; **takes effect in**: "
        + ", ".join(f"`{reference}`" for reference in entry.where),
        f"- **parity**: {classes}: {entry.parity_why}",
    ]
    if entry.blockers is not None:
        lines.append("- **blocked by** other settings: an explicit optimised value there is a configuration error, "
                     "`auto` resolves to the plain value and says why")
    return [*lines, ""]


def render() -> str:
    """The whole of ``docs/flags.md``."""
    lines = [
        "# Flag reference",
        "",
        "Generated from the flag registry (`reference_trainers/config/flags.py`) by "
        "`python -m harness.report.flag_docs > docs/flags.md`; a test fails when this page is stale.",
        "",
        "Every optimisation is one switch with its plain path beside it. A preset's `baseline` variant runs every "
        "flag at its plain value; its `optimized` variant starts from the registry's optimised value (mostly "
        "`auto`) and lists only what it sets differently. `auto` resolves per device and config, and the resolved "
        "value with its reason is recorded in the result (`rlgauge config PRESET` shows both). An optimised value "
        "the device or config cannot honour is a configuration error naming why, never a silent no-op.",
        "",
        "## Summary",
        "",
        "| key | plain | optimised | parity | applies to |",
        "|---|---|---|---|---|",
    ]
    for entry in FLAGS:
        lines.append(f"| `{entry.key}` | `{_value(entry.plain)}` | "
                     f"{', '.join(f'`{_value(v)}`' for v in entry.optimised)} | {entry.parity} | {_scope(entry)} |")
    lines += ["", "## Parity classes", ""]
    lines += [f"- **{name}**: {promise}" for name, promise in CLASS_PROMISES.items()]
    for role, title in ROLE_TITLES.items():
        lines += ["", f"## {title}", ""]
        for entry in FLAGS:
            if entry.role == role:
                lines += _section(entry)
    lines += ["## Tuning thresholds", "",
              "Named defaults that feed `auto` rules and optimised paths; override them under `tuning:`.", "",
              "| key | default | why |", "|---|---|---|"]
    lines += [f"| `tuning.{t.name}` | {t.default} | {t.why} |" for t in TUNINGS]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
