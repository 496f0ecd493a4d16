"""``optimizations.analytic_grads``: MLP forward and backward passes written out by hand.

On the CPU a small MLP update spends most of its time on per-op overhead: autograd records a
node per op and runs each node's backward through its engine. Here the forward keeps the
activations it needs, and ``mlp_backward`` applies the chain rule with one matmul per weight
and per layer input, one sum per bias and one elementwise op per activation, the formulas
torch's own backward functions use (``AddmmBackward``, ``TanhBackward``,
``ThresholdBackward``), under ``no_grad``. The loss's gradient with respect to the network
outputs is the algorithm's (``ppo.loss.ppo_loss_grads``). Same maths as autograd, reassociated
sums: the fp-reorder parity class. Guarded by tests/test_analytic.py.

``optimizations.aten_tanh``: inside a compiled CPU step, tanh on activations of at least
``tuning.aten_tanh_min_elements`` elements calls ATen's kernel instead of the one inductor
generates (``tanh``; the threshold reaches ``mlp_forward`` as an argument).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from reference_trainers.nets.networks import MLP

if TYPE_CHECKING:
    from reference_trainers.config.schema import TrainConfig

ACTIVATION_NAMES: dict[type[nn.Module], str] = {nn.Tanh: "tanh", nn.ReLU: "relu"}


@torch.library.custom_op("rlgauge::aten_tanh", mutates_args=())
def aten_tanh(x: torch.Tensor) -> torch.Tensor:
    """``torch.tanh`` as one opaque op: ``torch.compile`` calls ATen's kernel instead of generating one."""
    return torch.tanh(x)


@aten_tanh.register_fake
def _aten_tanh_shape(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def aten_tanh_from(config: TrainConfig) -> int | None:
    """``optimizations.aten_tanh``: the activation size (``tuning.aten_tanh_min_elements``) from which
    a compiled CPU step calls ATen's tanh; None (the plain path): inductor's own everywhere."""
    return config.tuning.aten_tanh_min_elements if config.optimizations.aten_tanh else None


def tanh(x: torch.Tensor, aten_from: int | None = None) -> torch.Tensor:
    """``torch.tanh``; in a compiled CPU step on an activation of at least ``aten_from`` elements
    (``aten_tanh_from``), ATen's kernel as one opaque op."""
    if (aten_from is not None and torch.compiler.is_compiling() and x.device.type == "cpu"
            and x.numel() >= aten_from and not torch.is_grad_enabled()):
        return aten_tanh(x)
    return torch.tanh(x)


def supports(mlp: nn.Module) -> bool:
    """True if ``mlp`` is an ``MLP`` of ``nn.Linear`` layers with tanh or ReLU between them."""
    if not isinstance(mlp, MLP):
        return False
    return all(isinstance(layer, nn.Linear) or type(layer) in ACTIVATION_NAMES for layer in mlp)


def mlp_forward(mlp: MLP, x: torch.Tensor, aten_tanh_from: int | None = None
                ) -> tuple[torch.Tensor, list[tuple[nn.Linear, torch.Tensor, str | None]]]:
    """The MLP's output and, per linear layer, (layer, its input, the activation applied to its input or None).
    ``aten_tanh_from``: see ``tanh`` (None: ``torch.tanh``)."""
    saved: list[tuple[nn.Linear, torch.Tensor, str | None]] = []
    activation: str | None = None
    for layer in mlp:
        if isinstance(layer, nn.Linear):
            saved.append((layer, x, activation))
            x = F.linear(x, layer.weight, layer.bias)
            activation = None
        else:
            activation = ACTIVATION_NAMES[type(layer)]
            x = tanh(x, aten_tanh_from) if activation == "tanh" else torch.relu(x)
    return x, saved


def mlp_grads(saved: list[tuple[nn.Linear, torch.Tensor, str | None]], grad_out: torch.Tensor) -> list[torch.Tensor]:
    """``mlp_backward``'s gradients as new tensors, in the order of the MLP's ``parameters()``
    (weight, bias, layer by layer): the pure form ``torch.compile`` traces."""
    grads: list[torch.Tensor] = []
    for index in range(len(saved) - 1, -1, -1):
        layer, layer_input, activation = saved[index]
        grads += [grad_out.sum(0), grad_out.t().mm(layer_input)]  # reversed below
        if index == 0:
            break
        grad_out = _activation_backward(grad_out.mm(layer.weight), layer_input, activation)
    return grads[::-1]


def mlp_backward(saved: list[tuple[nn.Linear, torch.Tensor, str | None]], grad_out: torch.Tensor) -> None:
    """Set ``.grad`` of every weight and bias from the gradient of the loss with respect to the output
    (written into the existing ``.grad`` tensors where there are some)."""
    for index in range(len(saved) - 1, -1, -1):
        layer, layer_input, activation = saved[index]
        if layer.weight.grad is None:
            layer.weight.grad = grad_out.t().mm(layer_input)
            layer.bias.grad = grad_out.sum(0)
        else:  # in place, into the gradient storage the learner keeps (``Learner.flat_grad``)
            torch.mm(grad_out.t(), layer_input, out=layer.weight.grad)
            torch.sum(grad_out, 0, out=layer.bias.grad)
        if index == 0:
            return
        grad_out = _activation_backward(grad_out.mm(layer.weight), layer_input, activation)


def _activation_backward(grad_in: torch.Tensor, layer_input: torch.Tensor, activation: str | None) -> torch.Tensor:
    """The gradient before the activation whose output is ``layer_input``."""
    if activation == "tanh":  # d tanh(z) = 1 - tanh(z)^2, from the saved output
        return torch.ops.aten.tanh_backward(grad_in, layer_input)
    return torch.ops.aten.threshold_backward(grad_in, layer_input, 0)  # relu: pass where the output is positive
