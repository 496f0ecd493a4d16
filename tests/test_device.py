"""Tests for reference_trainers.runtime.device: resolution, precision/thread settings, autocast, scaler, memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from precision_state import cuda_tf32_enabled, float32_matmul_precision

import reference_trainers.runtime.device as dev
from reference_trainers.config.schema import ConfigError
from reference_trainers.runtime.device import (
    DeviceError,
    apply_precision,
    apply_threads,
    autocast,
    grad_scaler,
    peak_device_memory_mb,
    reset_peak_memory,
    resolve_device,
    supports_bf16,
    supports_fp16_autocast,
    supports_fused_adam,
    supports_tf32,
    synchronize,
)

CPU = torch.device("cpu")
HAS_CUDA = torch.cuda.is_available()
HAS_MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
needs_mps = pytest.mark.skipif(not HAS_MPS, reason="needs an Apple MPS device")


def fake_hardware(monkeypatch: pytest.MonkeyPatch, *, cuda: bool, mps: bool, cuda_count: int = 1) -> None:
    monkeypatch.setattr(dev, "cuda_available", lambda: cuda)
    monkeypatch.setattr(dev, "mps_available", lambda: mps)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_count if cuda else 0)


def device_error(requested: str) -> str:
    with pytest.raises(DeviceError) as info:
        resolve_device(requested)
    message = str(info.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


@pytest.fixture
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    ("cuda", "mps", "expected"),
    [(True, True, "mps"), (False, True, "mps"), (True, False, "cuda"), (False, False, "cpu")],
)
def test_auto_prefers_mps_then_cuda_then_cpu(monkeypatch: pytest.MonkeyPatch, cuda: bool, mps: bool, expected: str) -> None:
    fake_hardware(monkeypatch, cuda=cuda, mps=mps)
    assert resolve_device("auto") == torch.device(expected)
    assert dev.available_devices()[0] == expected
    assert dev.available_devices()[-1] == "cpu"


def test_cpu_is_always_available(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hardware(monkeypatch, cuda=False, mps=False)
    assert resolve_device("cpu") == CPU
    assert dev.available_devices() == ["cpu"]


def test_device_error_is_a_config_error() -> None:
    assert issubclass(DeviceError, ConfigError)


@pytest.mark.parametrize("requested", ["cuda", "cuda:0", "cuda:3"])
def test_cuda_requested_without_cuda_names_what_is_available(monkeypatch: pytest.MonkeyPatch, requested: str) -> None:
    fake_hardware(monkeypatch, cuda=False, mps=False)
    message = device_error(requested)
    assert message.startswith("device:") and "CUDA is not available" in message
    assert "accepted here: auto, cpu" in message
    assert "mps" not in message.partition("accepted here")[2]


def test_cuda_requested_on_mac_lists_mps_as_available(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hardware(monkeypatch, cuda=False, mps=True)
    assert "accepted here: auto, mps, cpu" in device_error("cuda")


def test_mps_requested_without_mps_names_what_is_available(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hardware(monkeypatch, cuda=True, mps=False)
    message = device_error("mps")
    assert message.startswith("device:") and "MPS is not available" in message
    assert "accepted here: auto, cuda, cpu" in message


def test_cuda_index_beyond_device_count_names_existing_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hardware(monkeypatch, cuda=True, mps=False, cuda_count=2)
    message = device_error("cuda:3")
    assert "'cuda:3'" in message and "cuda:0..cuda:1" in message


def test_existing_cuda_index_and_mps_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hardware(monkeypatch, cuda=True, mps=True, cuda_count=2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("mps") == torch.device("mps")


@pytest.mark.parametrize("requested", ["gpu", "tpu", "xla:0"])
def test_unknown_device_name_is_device_error(requested: str) -> None:
    message = device_error(requested)
    assert repr(requested) in message and "accepted" in message



def test_cuda_with_empty_index_is_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hardware(monkeypatch, cuda=True, mps=False)
    device_error("cuda:")


# --------------------------------------------------------------------------- capabilities (CPU)


def test_cpu_capabilities() -> None:
    assert supports_bf16(CPU) is True
    assert supports_tf32(CPU) is False
    assert supports_fp16_autocast(CPU) is torch.amp.is_autocast_available("cpu")
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    assert supports_fused_adam(CPU) is ((major, minor) >= (2, 4))


@pytest.mark.skipif(not supports_fused_adam(CPU), reason="fused CPU Adam needs torch 2.4")
def test_fused_adam_really_runs_where_supported() -> None:
    param = torch.nn.Parameter(torch.ones(4))
    optimiser = torch.optim.Adam([param], lr=0.1, fused=True)
    param.sum().backward()
    optimiser.step()
    assert torch.all(param < 1)


@pytest.mark.parametrize(("version", "cpu", "mps"), [("2.3.1", False, False), ("2.4.0", True, False), ("2.5.0+cpu", True, True), ("2.13.0", True, True)])
def test_fused_adam_support_follows_torch_version(monkeypatch: pytest.MonkeyPatch, version: str, cpu: bool, mps: bool) -> None:
    monkeypatch.setattr(torch, "__version__", version)
    assert supports_fused_adam(CPU) is cpu
    assert supports_fused_adam(torch.device("mps")) is mps
    assert supports_fused_adam(torch.device("cuda")) is True


# --------------------------------------------------------------------------- global settings


@pytest.mark.parametrize("precision", ["high", "medium", "highest"])
def test_apply_precision_sets_float32_matmul_precision(precision: str) -> None:
    other = "medium" if precision != "medium" else "highest"
    torch.set_float32_matmul_precision(other)
    apply_precision(precision, tf32=False)
    assert float32_matmul_precision() == precision


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="TF32 switches exist only in CUDA builds")
@pytest.mark.parametrize("precision", ["high", "medium", "highest"])
def test_apply_precision_sets_tf32_switches_whatever_the_matmul_precision(precision: str) -> None:
    apply_precision(precision, tf32=True)
    assert cuda_tf32_enabled() and float32_matmul_precision() == precision
    apply_precision(precision, tf32=False)
    assert not cuda_tf32_enabled() and float32_matmul_precision() == precision


def test_process_settings_round_trip_even_when_backends_disagree() -> None:
    saved = dev.process_settings()
    torch.set_float32_matmul_precision("medium")
    if dev.PER_BACKEND_PRECISION:  # CUDA matmuls in full float32 while CPU matmuls run in bf16
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert float32_matmul_precision() == "medium"
    mixed = dev.process_settings()
    dev.restore_process_settings(saved)
    assert dev.process_settings() == saved and float32_matmul_precision() == "highest"
    dev.restore_process_settings(mixed)
    assert dev.process_settings() == mixed


def test_apply_threads_sets_and_none_restores_the_default(restore_threads: None) -> None:
    apply_threads(1)
    assert torch.get_num_threads() == 1
    apply_threads(None)
    assert torch.get_num_threads() == dev.DEFAULT_THREADS
    apply_threads(1)
    apply_threads(dev.DEFAULT_THREADS)
    assert torch.get_num_threads() == dev.DEFAULT_THREADS


# --------------------------------------------------------------------------- autocast and scaler


def test_disabled_autocast_is_a_no_op() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast(CPU, enabled=False, dtype=torch.bfloat16):
        assert not torch.is_autocast_enabled("cpu")
        out = a @ b
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, a @ b, rtol=0, atol=0)


def test_enabled_cpu_bfloat16_autocast_runs_matmul_in_bfloat16() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with autocast(CPU, enabled=True, dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
        out = a @ b
        layer_out = torch.nn.Linear(8, 3)(a)
    assert out.dtype == torch.bfloat16 and layer_out.dtype == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")  # left cleanly
    torch.testing.assert_close(out.float(), a @ b, rtol=2e-2, atol=5e-2)


def test_enabled_grad_scaler_scales_loss_and_unscales_before_step() -> None:
    scaler = grad_scaler(CPU, enabled=True)
    assert scaler.is_enabled()
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    loss = (param * torch.tensor([3.0, 4.0])).sum()
    scaled = scaler.scale(loss)
    assert scaled.item() == pytest.approx(loss.item() * scaler.get_scale())
    assert scaler.get_scale() > 1
    optimiser = torch.optim.SGD([param], lr=0.5)
    scaled.backward()
    scaler.step(optimiser)
    scaler.update()
    # The step used the true gradient (3, 4), not the scaled one.
    torch.testing.assert_close(param.detach(), torch.tensor([1.0 - 1.5, 2.0 - 2.0]))


def test_disabled_grad_scaler_is_a_pass_through() -> None:
    scaler = grad_scaler(CPU, enabled=False)
    assert not scaler.is_enabled()
    param = torch.nn.Parameter(torch.tensor([1.0]))
    loss = (param * 2).sum()
    assert scaler.scale(loss) is loss
    optimiser = torch.optim.SGD([param], lr=0.25)
    scaler.scale(loss).backward()
    scaler.step(optimiser)
    scaler.update()
    torch.testing.assert_close(param.detach(), torch.tensor([0.5]))


# --------------------------------------------------------------------------- memory and sync


def test_cpu_has_no_device_memory_probe() -> None:
    reset_peak_memory(CPU)  # must be a harmless no-op
    synchronize(CPU)
    assert peak_device_memory_mb(CPU) is None


def test_cpu_device_name_is_not_empty() -> None:
    assert dev.device_name(CPU)


# --------------------------------------------------------------------------- real CUDA


@needs_cuda
def test_real_cuda_resolution() -> None:
    assert resolve_device("cuda").type == "cuda"
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    if not HAS_MPS:
        assert resolve_device("auto").type == "cuda"
    count = torch.cuda.device_count()
    message = device_error(f"cuda:{count}")
    assert f"cuda:0..cuda:{count - 1}" in message


@needs_cuda
def test_real_cuda_capabilities_match_torch() -> None:
    cuda = torch.device("cuda")
    assert supports_bf16(cuda) is bool(torch.cuda.is_bf16_supported())
    assert supports_tf32(cuda) is (torch.cuda.get_device_capability(cuda)[0] >= 8)
    assert supports_fused_adam(cuda) is True
    assert dev.device_name(cuda) == torch.cuda.get_device_name(cuda)
    if supports_bf16(cuda):
        a = torch.randn(8, 8, device=cuda)
        with autocast(cuda, enabled=True, dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16


@needs_cuda
def test_real_cuda_peak_memory_tracks_allocation() -> None:
    cuda = torch.device("cuda")
    synchronize(cuda)
    reset_peak_memory(cuda)
    block = torch.empty(16 * 2**20, dtype=torch.uint8, device=cuda)  # 16 MiB
    synchronize(cuda)
    peak = peak_device_memory_mb(cuda)
    assert peak is not None and peak >= 16
    del block


@needs_cuda
def test_real_cuda_fp16_grad_scaler_is_enabled() -> None:
    scaler = grad_scaler(torch.device("cuda"), enabled=True)
    assert scaler.is_enabled()


# --------------------------------------------------------------------------- real MPS


@needs_mps
def test_real_mps_resolution() -> None:
    assert resolve_device("mps") == torch.device("mps")
    assert resolve_device("auto") == torch.device("mps")


@needs_mps
def test_real_mps_bf16_probe_is_truthful() -> None:
    mps = torch.device("mps")
    if supports_bf16(mps):
        a = torch.randn(8, 8, device=mps)
        with autocast(mps, enabled=True, dtype=torch.bfloat16):
            assert (a @ a).dtype == torch.bfloat16
    else:
        with pytest.raises((RuntimeError, TypeError)):
            torch.ones(1, dtype=torch.bfloat16, device=mps)


@needs_mps
def test_real_mps_memory_probe_reports_megabytes() -> None:
    mps = torch.device("mps")
    block = torch.empty(16 * 2**20, dtype=torch.uint8, device=mps)
    synchronize(mps)
    peak = peak_device_memory_mb(mps)
    assert isinstance(peak, float) and peak >= 16
    del block
