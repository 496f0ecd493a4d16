"""The diagnosis as a readable report (``rlgauge diagnose`` without ``--json``)."""

from __future__ import annotations

from typing import Any

from harness.diagnosis.frames import short
from harness.diagnosis.phases import SHOWN_PHASES

_REPLAY = "  (eager replay only: inside a compiled function, whose compiled code does not run it as written)"
_PROBE_ORDER = ("env", "inference", "update", "transfer", "logging", "other")


def _split(shares: dict[str, float], order: tuple[str, ...]) -> str:
    return ", ".join(f"{name} {shares.get(name, 0.0):.1f}%" for name in order)


def _acting_at(d: dict[str, Any]) -> str:
    """``, acting at FILE:LINE``: the loop's acting calls, where any were seen."""
    sites = d.get("inference_forward_sites") or []
    return f", acting at {', '.join(short(w) for w in sites)}" if sites else ""


def _hot_lines(hot: dict[str, Any] | None) -> list[str]:
    """The dominant phase's hottest lines, and the Python loops over the batch among the update's."""
    if not hot or not hot["lines"]:
        return []
    out = [f"hot lines of the {hot['phase']} phase (audit; share of its kernels and of its op time, kernels per "
           "optimizer step):"]
    out += [f"  {h['kernel_share']:5.1f}% kernels {h['time_share']:5.1f}% time {h['kernels_per_update']:9.1f}/update  "
            f"{short(h['where'])}" + (_REPLAY if h.get("eager_replay_only") else "") for h in hot["lines"]]
    out += [f"  a Python loop over the batch at {short(loop['loop'])}: {loop['kernels_per_update']:.0f} small kernels "
            f"per update at {', '.join(short(w) for w in loop['lines'])}: vectorise it" for loop in hot["batch_loops"]]
    return out


def _compile_line(loop: dict[str, Any]) -> str:
    """torch.compile as the trainer has it: frames, breaks by kind and line, recompiles while diagnosed."""
    sites = loop.get("graph_break_sites", [])
    breaks = "; ".join(f"{s['kind']} at {short(s['where'])}" for s in sites[:6])
    calls = loop.get("compiled_calls") or {}
    roles = ", ".join(f"{count} {role}" for role, count in sorted(calls.items()))
    return (f"compile: {loop['frames_compiled']} frames compiled, {loop['graph_breaks']} graph breaks"
            + (f" ({breaks})" if breaks else "") + f", {loop['recompiles']} recompiles while diagnosed"
            + (f" ({loop['recompile_reasons'][0]})" if loop.get("recompile_reasons") else "")
            + (f"; compiled calls timed from outside: {roles}" if roles else ""))


def report_lines(d: dict[str, Any]) -> list[str]:
    """Phases, host syncs, float64, loop shape, recommendations and the hooks' overhead, as lines."""
    loop, over = d["loop"], d["overhead"]
    what = f"your trainer {d['trainer']}" if d["kind"] == "trainer" else f"{d['preset']}"
    lines = [f"diagnosed: {what} ({d['variant']}) on {d['device']}, {d['env_steps']['hooked']:,} env steps with the "
             "phase hooks on, "
             f"{d['env_steps']['audit']:,} audited for syncs, float64 and kernels",
             "phases found by the hooks (% of iterate() wall time): " + _split(d["phases"], SHOWN_PHASES)]
    if d.get("probe_phases"):
        lines.append("phases the trainer reports to the probe:       " + _split(d["probe_phases"], _PROBE_ORDER))
    per_step = sum(s["per_env_step"] for s in d["host_syncs"])
    envs = loop.get("envs_per_step", 1.0)
    lines.append(f"host syncs per env step: {per_step:.2f}" + (
        f" ({per_step * envs:.2f} per vector step of {envs:g} envs: run's host_syncs_per_step)" if d["host_syncs"]
        else " (none)"))
    lines += [f"  {s['per_env_step']:8.3f}  {s['kind']:<28} {short(s['where']):<24} {s.get('cause', '')}"
              + (_REPLAY if s.get("eager_replay_only") else "") for s in d["host_syncs"][:10]]
    if len(d["host_syncs"]) > 10:
        lines.append(f"  ... {len(d['host_syncs']) - 10} more sites (--json lists them all)")
    lines += [f"  {s['per_env_step']:8.3f}  {s['kind']:<28} inside compiled {s['function']} (the compiled path, "
              "as it runs)" for s in loop.get("compiled_syncs", [])]
    lines.append(f"float64 ops: {sum(f['count'] for f in d['float64'])}" + ("" if d["float64"] else " (none)"))
    lines += [f"  {f['count']:8d}  {f['op']:<28} {short(f['where'])}" + (f"  `{f['call']}`" if f.get("call") else "")
              + (_REPLAY if f.get("eager_replay_only") else "") for f in d["float64"][:10]]
    lines += _hot_lines(d.get("hot_lines"))
    opts = ", ".join(f"{o['class']} ({o['impl']})" for o in loop["optimizers"]) or "none stepped"
    lines += [
        f"loop shape: {d['forwards_per_env_step']:.3f} acting forwards and "
        f"{loop['update_forwards_per_env_step']:.3f} update forwards per env step (outermost modules; "
        f"{d['rows_per_inference_forward']:.1f} rows per acting forward; {loop['envs_per_step']:g} envs per "
        f"vector step){_acting_at(d)}; {loop['optimizer_steps_per_env_step']:.3g} optimizer steps per env step; "
        f"{loop['kernels_per_env_step']:.1f} kernels per env step; optimizer: {opts}; torch threads: "
        f"{loop['torch_threads']}; envs: {', '.join(loop['env_classes']) or 'none seen'}",
        _compile_line(loop),
    ]
    if over["hooks_pct"] is not None:
        audit = over["audit_env_steps_per_sec"]
        lines.append(f"overhead: {over['plain_env_steps_per_sec']:,.0f} env steps/s without hooks, "
                     f"{over['hooked_env_steps_per_sec']:,.0f} with the phase hooks ({over['hooks_pct']:+.0f}% time)"
                     + (f", {audit:,.0f} in the audit" if audit else "")
                     + "; no figure of run or gate is taken with them")
    if d.get("env_ceiling_steps_per_sec"):
        fraction = d.get("fraction_of_ceiling")
        lines.append(f"env-only ceiling (random actions, same backend and envs): {d['env_ceiling_steps_per_sec']:,.0f} "
                     "env steps/s" + (f"; the pass without hooks reaches {100 * fraction:.1f}% of it" if fraction else ""))
    if loop.get("calls_per_block", 1) > 1:
        lines.append(f"blocks: {loop['calls_per_block']} iterate() calls at a time (one update each), with hooks and "
                     "without in turn, and in the audit")
    lines += [f"warning: {text}" for text in d.get("warnings", [])]
    if d.get("ran_out"):
        lines.append("note: the trainer ran out of iterations before the passes were complete")
    lines.append("recommendations:" if d["recommendations"] else
                 "recommendations: none (no finding behind any rule)")
    for rec in d["recommendations"]:
        lines += [f"  - {rec['change']}", f"      finding: {rec['evidence']}", f"      why: {rec['why']}",
                  f"      measured: {rec['effect']}", f"      check: {rec['check']}"]
    if d.get("flag_advice"):
        lines.append("flag advice (the preset's flags, from the probe's split):")
        lines += [f"  - [{a['rule']}] {a['advice']}" for a in d["flag_advice"]]
    return lines
