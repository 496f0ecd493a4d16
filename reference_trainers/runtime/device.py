"""Device resolution, precision settings, autocast and memory probes: one place for each."""

from __future__ import annotations

import contextlib
import platform
import torch

from reference_trainers.config.schema import ConfigError, TrainConfig


class DeviceError(ConfigError):
    """A requested device or device capability is not available here."""


def cuda_available() -> bool:
    return torch.cuda.is_available()


def mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def available_devices() -> list[str]:
    """Device names usable here, best first (the order ``auto`` prefers)."""
    found = []
    if mps_available():
        found.append("mps")
    if cuda_available():
        found.append("cuda")
    found.append("cpu")
    return found


def resolve_device(requested: str) -> torch.device:
    """``auto`` -> mps > cuda > cpu; an explicit device that is not here is a ``DeviceError``."""
    if requested == "auto":
        return torch.device(available_devices()[0])
    base, sep, index = requested.partition(":")
    if sep and (base != "cuda" or not index.isdigit()):
        raise DeviceError(f"device: invalid device {requested!r}; accepted: auto, cpu, cuda, cuda:N, mps")
    if base == "cpu":
        return torch.device("cpu")
    if base == "cuda":
        if not cuda_available():
            built = "with" if torch.version.cuda else "without"
            raise DeviceError(
                f"device: {requested!r} requested but CUDA is not available (torch {torch.__version__} built {built} CUDA); "
                f"accepted here: auto, {', '.join(available_devices())}"
            )
        count = torch.cuda.device_count()
        if index and int(index) >= count:
            raise DeviceError(f"device: {requested!r} does not exist; this machine has cuda:0..cuda:{count - 1}")
        return torch.device(requested)
    if base == "mps":
        if not mps_available():
            raise DeviceError(
                f"device: 'mps' requested but Apple MPS is not available on {platform.system()}; "
                f"accepted here: auto, {', '.join(available_devices())}"
            )
        return torch.device("mps")
    raise DeviceError(f"device: unknown device {requested!r}; accepted: auto, cpu, cuda, cuda:N, mps")


def supports_bf16(device: torch.device) -> bool:
    """bfloat16 autocast works on this device (CPU always; CUDA on Ampere+; MPS on macOS 14+)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError):
            return False
        return True
    return True


def supports_fp16_autocast(device: torch.device) -> bool:
    """float16 autocast (with GradScaler) is available for this device type."""
    return torch.amp.is_autocast_available(device.type) and device.type in ("cuda", "cpu", "mps")


def supports_tf32(device: torch.device) -> bool:
    """TF32 tensor cores exist (CUDA, compute capability 8.0+)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8


def supports_fused_adam(device: torch.device) -> bool:
    """``Adam(fused=True)`` runs on this device (CUDA; CPU since torch 2.4; MPS since 2.5)."""
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        return (major, minor) >= (2, 4)
    if device.type == "mps":
        return (major, minor) >= (2, 5)
    return False


DEFAULT_THREADS = torch.get_num_threads()


_default_threads = DEFAULT_THREADS


def cap_default_threads(cap: int | None) -> None:
    """Cap the thread count ``apply_threads(None)`` uses (None: torch's default again). The
    harness caps it at the cores other processes leave free (``run.fair_threads``)."""
    global _default_threads
    _default_threads = DEFAULT_THREADS if cap is None else max(1, min(DEFAULT_THREADS, int(cap)))


def default_threads() -> int:
    """The intra-op thread count a trainer with ``torch_threads`` unset runs with."""
    return _default_threads


def apply_threads(threads: int | None) -> None:
    """Set intra-op CPU threads (None = the process default, capped by ``cap_default_threads``);
    cheap, called per iteration."""
    wanted = threads or _default_threads
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)


# torch 2.9 added per-backend ``fp32_precision`` switches; once they disagree (TF32 off for CUDA
# matmuls while CPU matmuls run in bf16, say) the legacy getter refuses to answer.
PRECISION_SWITCHES = tuple(backend for backend in (
    getattr(torch.backends.cuda, "matmul", None), getattr(torch.backends.cudnn, "conv", None),
    getattr(torch.backends.cudnn, "rnn", None), getattr(torch.backends.mkldnn, "matmul", None),
    getattr(torch.backends.mkldnn, "conv", None), getattr(torch.backends.mkldnn, "rnn", None),
) if backend is not None and hasattr(backend, "fp32_precision"))
PER_BACKEND_PRECISION = bool(PRECISION_SWITCHES)


def process_settings() -> tuple:
    """The process-wide settings trainers change (threads, matmul precision, TF32 switches)."""
    if PER_BACKEND_PRECISION:
        try:
            legacy: str | None = torch.get_float32_matmul_precision()
        except RuntimeError:  # the switches disagree; they say it all
            legacy = None
        return (torch.get_num_threads(), (legacy, *(backend.fp32_precision for backend in PRECISION_SWITCHES)))
    cuda = torch.backends.cuda.is_built()
    return (torch.get_num_threads(), (torch.get_float32_matmul_precision(),
            cuda and torch.backends.cuda.matmul.allow_tf32, cuda and torch.backends.cudnn.allow_tf32))


def restore_process_settings(saved: tuple) -> None:
    threads, precision = saved
    torch.set_num_threads(threads)
    if PER_BACKEND_PRECISION:
        legacy, *switches = precision
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        for backend, value in zip(PRECISION_SWITCHES, switches):
            backend.fp32_precision = value
        return
    matmul_precision, matmul_tf32, cudnn_tf32 = precision
    torch.set_float32_matmul_precision(matmul_precision)
    if torch.backends.cuda.is_built():
        torch.backends.cuda.matmul.allow_tf32 = matmul_tf32
        torch.backends.cudnn.allow_tf32 = cudnn_tf32


def apply_precision(matmul_precision: str, tf32: bool) -> None:
    """Set the process-wide float32 matmul precision and, on CUDA, the TF32 switches.

    Global state: the trainer re-applies its own settings before each iteration so two
    trainers in one process (baseline and optimised, interleaved) each run with theirs.
    """
    torch.set_float32_matmul_precision(matmul_precision)
    if not torch.backends.cuda.is_built():
        return
    if PER_BACKEND_PRECISION:  # the per-backend switches (the legacy ones are deprecated there)
        value = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = value
        torch.backends.cudnn.conv.fp32_precision = value
        torch.backends.cudnn.rnn.fp32_precision = value
        return
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def amp_dtype(config: TrainConfig) -> torch.dtype:
    """The autocast dtype ``optimizations.amp_dtype`` names (float16 unless bfloat16)."""
    return torch.bfloat16 if config.optimizations.amp_dtype == "bfloat16" else torch.float16


def autocast(device: torch.device, enabled: bool, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """Autocast context for the forward pass, or a no-op context when AMP is off."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class Float32GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` whose ``unscale_`` stays in float32.

    torch computes the inverse scale as ``scale.double().reciprocal().float()`` (except on
    MPS, which has no float64): a float64 op on the training path. The scale is always a
    power of two (initial 2**16, growth 2, backoff 0.5), so its float32 reciprocal is exact
    and the result is bit-identical. Guarded by the float64 property tests with fp16 AMP.
    """

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._enabled:
            return
        from torch.amp.grad_scaler import OptState

        self._check_scale_growth_tracker("unscale_")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._scale.reciprocal()
        found_inf = torch.full((), 0.0, dtype=torch.float32, device=self._scale.device)
        state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, found_inf, False)
        state["stage"] = OptState.UNSCALED


def grad_scaler(device: torch.device, enabled: bool) -> torch.amp.GradScaler:
    """GradScaler for float16 AMP (float32-only unscale); a disabled pass-through otherwise."""
    return Float32GradScaler(device.type, enabled=enabled)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (used only at measurement boundaries)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_device_memory_mb(device: torch.device) -> float | None:
    """CUDA: max allocated since the last reset; MPS: driver-allocated now; CPU: None."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return f"Apple MPS ({platform.machine()})"
    return platform.processor() or platform.machine()
