"""Where a result came from: git commit of the measured code, and the machine."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

from reference_trainers.runtime import device as dev

_CODE_ROOT = Path(__file__).resolve().parents[2]


def git_info(root: Path = _CODE_ROOT) -> dict[str, object]:
    """Commit and dirty flag of the checkout the harness runs from (None outside git). ``RLGAUGE_COMMIT``,
    when set, names the commit instead: a tree copied to another machine or into a container, with no
    ``.git`` or another one."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    if os.environ.get("RLGAUGE_COMMIT"):
        return {"commit": os.environ["RLGAUGE_COMMIT"], "dirty": False}
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status)}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict[str, object]:
    """Machine fingerprint recorded in every result."""
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count() or 1,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "mps": dev.mps_available(),
        "device": str(device),
        "device_name": dev.device_name(device),
        "torch_threads": torch.get_num_threads(),
    }
