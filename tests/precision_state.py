"""What the process-wide float32 matmul switches say now (the tests read back what ``device.apply_precision`` set)."""

from __future__ import annotations

import torch

from reference_trainers.runtime.device import PER_BACKEND_PRECISION

_PRECISION_OF_CPU_SWITCH = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def float32_matmul_precision() -> str:
    """The float32 matmul precision in effect for CPU matmuls: ``highest``, ``high`` or ``medium``."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:  # per-backend switches disagree: read the CPU one
        return _PRECISION_OF_CPU_SWITCH.get(torch.backends.mkldnn.matmul.fp32_precision, "highest")


def cuda_tf32_enabled() -> bool:
    """Whether float32 CUDA matmuls may run in TF32."""
    if not torch.backends.cuda.is_built():
        return False
    if PER_BACKEND_PRECISION and torch.backends.cuda.matmul.fp32_precision != "none":
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)
