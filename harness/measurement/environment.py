"""What this machine offers for training: torch build, threads, devices, precision support, torch.compile.

``torch.compile`` is tried for real, on a tiny function, in a child process with a time limit,
so a hanging or crashing compiler (no C++ toolchain, a broken Triton) cannot take the
caller down with it.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from typing import Any

import gymnasium
import numpy as np
import torch

from reference_trainers.runtime import device as dev

from harness.measurement.provenance import cpu_name

COMPILE_TIMEOUT_S = 180.0
MPS_FLOAT64_NOTE = ("MPS has no float64: every tensor on the training path must be float32 "
                    "(torch.as_tensor(np_float64, device='mps') raises)")

_COMPILE_PROBE = """
import sys, torch
device = sys.argv[1]
def f(x):
    return torch.sin(x) * 2.0 + x.relu()
x = torch.randn(64, device=device)
compiled = torch.compile(f)
assert torch.allclose(compiled(x), f(x), atol=1e-5), "compiled result differs from eager"
print("ok")
"""


def try_compile(device: str = "cpu", timeout_s: float = COMPILE_TIMEOUT_S) -> dict[str, Any]:
    """Compile and run a tiny function with ``torch.compile`` in a child process; never raises."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _COMPILE_PROBE, device], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"works": False, "device": device, "seconds": round(time.perf_counter() - start, 1),
                "error": f"did not finish within {timeout_s:.0f} s"}
    except OSError as exc:
        return {"works": False, "device": device, "seconds": 0.0, "error": f"cannot start a child process: {exc}"}
    seconds = round(time.perf_counter() - start, 1)
    if proc.returncode == 0 and proc.stdout.strip().endswith("ok"):
        return {"works": True, "device": device, "seconds": seconds, "error": None}
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return {"works": False, "device": device, "seconds": seconds,
            "error": lines[-1][:300] if lines else f"exit code {proc.returncode}"}


def cuda_devices() -> list[dict[str, Any]]:
    """Name, compute capability, memory, bf16 and TF32 support of each visible CUDA device."""
    out = []
    for index in range(torch.cuda.device_count() if dev.cuda_available() else 0):
        device = torch.device("cuda", index)
        props = torch.cuda.get_device_properties(index)
        out.append({"index": index, "name": props.name, "capability": f"{props.major}.{props.minor}",
                    "memory_gb": round(props.total_memory / 2**30, 1), "bf16": dev.supports_bf16(device),
                    "tf32": dev.supports_tf32(device)})
    return out


def environment_report(compile_device: str | None = None, check_compile: bool = True) -> dict[str, Any]:
    """The whole report as plain data (``--json`` prints it as it is)."""
    cuda = cuda_devices()
    report: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "cpu": cpu_name(),
        "cores": os.cpu_count() or 1, "torch": torch.__version__, "numpy": np.__version__,
        "gymnasium": gymnasium.__version__,
        "torch_threads": torch.get_num_threads(), "torch_interop_threads": torch.get_num_interop_threads(),
        "devices": dev.available_devices(),
        "cuda": {"available": bool(cuda), "version": torch.version.cuda, "devices": cuda},
        "mps": {"built": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_built()),
                "available": dev.mps_available(), "float64": False if dev.mps_available() else None,
                "note": MPS_FLOAT64_NOTE if dev.mps_available() else None},
        "cpu_bf16_autocast": dev.supports_bf16(torch.device("cpu")),
        "fused_adam_cpu": dev.supports_fused_adam(torch.device("cpu")),
    }
    if check_compile:
        target = compile_device or ("cuda" if cuda else "cpu")
        report["torch_compile"] = try_compile(target)
    return report


def environment_lines(report: dict[str, Any]) -> list[str]:
    """The report as short human-readable lines."""
    lines = [f"python {report['python']} on {report['platform']}",
             f"cpu: {report['cpu']} ({report['cores']} cores); torch threads: {report['torch_threads']} intra-op, "
             f"{report['torch_interop_threads']} inter-op",
             f"torch {report['torch']}, numpy {report['numpy']}, gymnasium {report['gymnasium']}",
             f"devices: {', '.join(report['devices'])}; CPU bf16 autocast: {_yes(report['cpu_bf16_autocast'])}; "
             f"fused Adam on CPU: {_yes(report['fused_adam_cpu'])}"]
    cuda = report["cuda"]
    if cuda["available"]:
        for d in cuda["devices"]:
            lines.append(f"cuda:{d['index']}: {d['name']}, capability {d['capability']}, {d['memory_gb']} GB, "
                         f"bf16: {_yes(d['bf16'])}, TF32: {_yes(d['tf32'])} (CUDA {cuda['version']})")
    else:
        lines.append("CUDA: not available" + (f" (torch built with CUDA {cuda['version']})" if cuda["version"] else
                                               " (CPU-only torch build)"))
    mps = report["mps"]
    lines.append(f"MPS: {'available; ' + mps['note'] if mps['available'] else 'not available'}")
    compiled = report.get("torch_compile")
    if compiled:
        state = (f"works ({compiled['seconds']} s for a tiny function on {compiled['device']})" if compiled["works"]
                 else f"FAILS on {compiled['device']}: {compiled['error']}")
        lines.append(f"torch.compile: {state}")
    return lines


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
