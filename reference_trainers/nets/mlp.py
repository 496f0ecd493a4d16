"""An MLP's maths, every backend side by side: one module to read how an MLP runs on each path.

- **torch, autograd** (the plain path): ``MLP``, whose forward calls the layers' functions
  directly; ``output_linear`` keeps the head in float32 under autocast.
- **torch, stacked** (``optimizations.stacked_mlps``): ``StackedMLPs``, actor and critic as one
  network (first layers concatenated, later ones block-diagonal).
- **torch, hand-written** (``optimizations.analytic_grads``): ``mlp_forward`` keeps the activations
  the backward needs; ``mlp_backward`` / ``mlp_grads`` apply the chain rule with one matmul per
  weight and per layer input, one sum per bias and one elementwise op per activation, the
  formulas torch's own backward functions use (``AddmmBackward``, ``TanhBackward``,
  ``ThresholdBackward``), under ``no_grad``. The loss's gradient with respect to the outputs is
  the algorithm's (``ppo.loss.ppo_loss_grads``, DQN's TD gradient). Same maths as autograd,
  reassociated sums: the fp-reorder parity class (tests/test_analytic.py).
  ``optimizations.aten_tanh``: inside a compiled CPU step, tanh on activations of at least
  ``tuning.aten_tanh_min_elements`` elements calls ATen's kernel instead of inductor's (``tanh``).
- **NumPy forward** (``optimizations.numpy_acting``): ``NumpyMLP`` over zero-copy views of the
  weights (``Dense``), or two MLPs side by side (``BlockDiagonal``): tests/test_numpy_acting.py.
- **NumPy forward and backward** (``optimizations.numpy_update``): ``HostMLP`` over views of the
  parameters and of their gradients: tests/test_numpy_update.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from reference_trainers.paths.numpy_acting import column_sums, relu_

if TYPE_CHECKING:
    from reference_trainers.config.schema import TrainConfig

__all__ = ["ACTIVATION_NAMES", "BlockDiagonal", "Dense", "HostLinear", "HostMLP", "MLP", "NumpyMLP", "OutputLinear",
           "StackedMLPs", "aten_tanh", "aten_tanh_from", "host_view", "mlp_backward", "mlp_forward", "mlp_grads",
           "output_linear", "supports", "tanh"]


# --------------------------------------------------------------------------- torch: autograd and stacked

def output_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A network's output layer: in float32 even under autocast.

    Q-values, quantiles, values and logits are argmax-ed, averaged over quantile samples or
    regressed onto returns of magnitude ~100, where bfloat16's 8 significand bits leave steps
    of 0.5: actions tie (argmax picks the first) and TD errors vanish. The head is a sliver
    of the network's work, so autocast keeps its speed everywhere else.
    """
    if not torch.is_autocast_enabled(x.device.type):
        return F.linear(x, weight, bias)
    with torch.autocast(x.device.type, enabled=False):
        return F.linear(x.float(), weight, bias)


class OutputLinear(nn.Linear):
    """``nn.Linear`` as ``output_linear``: float32 under autocast."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return output_linear(x, self.weight, self.bias)


class MLP(nn.Sequential):
    """``nn.Sequential`` of ``nn.Linear`` layers and activations whose ``forward`` applies the
    layers' functions directly: the same ops, without a module call (and its hook checks) per
    layer, which at the batch sizes of acting costs as much as the layer's arithmetic. Hooks
    registered on the whole MLP still run; hooks on its individual layers do not."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            if isinstance(layer, OutputLinear):
                x = output_linear(x, layer.weight, layer.bias)
            elif isinstance(layer, nn.Linear):
                x = F.linear(x, layer.weight, layer.bias)
            else:
                x = layer.forward(x)
        return x


class StackedMLPs:
    """Two MLPs of the same hidden shape over the same input, evaluated as one: the first
    layers' weights concatenated, the later ones block-diagonal, so one matmul and one
    activation per layer serve both (half the ops of calling each). The last layer is an
    ``output_linear``. A snapshot: build it again after the weights change.
    ``__call__(x) -> (first's output, second's output)``.
    """

    def __init__(self, first: MLP, second: MLP) -> None:
        pairs = [(a, b) for a, b in zip(first, second)]
        if len(first) != len(second) or any(type(a) is not type(b) for a, b in pairs):
            raise ValueError("StackedMLPs needs two MLPs with the same layer pattern")
        self.split = first[-1].out_features
        self.layers: list[tuple[torch.Tensor, torch.Tensor] | nn.Module] = []
        with torch.no_grad():
            for index, (a, b) in enumerate(pairs):
                if not isinstance(a, nn.Linear):
                    self.layers.append(a)
                elif index == 0:
                    self.layers.append((torch.cat([a.weight, b.weight]), torch.cat([a.bias, b.bias])))
                else:
                    self.layers.append((torch.block_diag(a.weight, b.weight), torch.cat([a.bias, b.bias])))

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            if isinstance(layer, tuple):
                x = output_linear(x, *layer) if index == last else F.linear(x, *layer)
            else:
                x = layer.forward(x)
        return x[:, :self.split], x[:, self.split:]


# --------------------------------------------------------------------------- torch: hand-written

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


# --------------------------------------------------------------------------- NumPy forward

BLOCK_SPLIT_MIN_WASTE = 131_072
"""Multiply-adds the full product of a block-diagonal layer spends on its zero blocks from which
the layer runs as two half-width products (less arithmetic, so faster); below it as one product
(one call beats two): from 16 rows for a pair of 64x64 layers, never for 64-row output heads."""


def _transposed_copy(weight: torch.Tensor) -> np.ndarray:
    """A C-contiguous float32 copy of ``weight.T`` (never a view: a snapshot)."""
    return np.array(weight.detach().numpy().T, dtype=np.float32, order="C")


class Dense:
    """A linear layer over NumPy arrays: ``weight`` (out, in) and ``weight_t`` (its transpose, either
    may be a view of the other), ``bias``. One row (a 1-D input) is a matrix-vector product with
    ``weight``, faster than a one-row matrix product at acting sizes."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray, weight_t: np.ndarray | None = None) -> None:
        self.weight, self.bias = weight, bias
        self.weight_t = weight.T if weight_t is None else weight_t

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = self.weight @ x if x.ndim == 1 else x @ self.weight_t  # a fresh array: activations work in place
        out += self.bias
        return out


class BlockDiagonal:
    """Two linear layers side by side: the first reads ``x[:, :split_in]``, the second the rest
    (a block-diagonal weight). Contiguous copies of the weights: a snapshot."""

    def __init__(self, first: nn.Linear, second: nn.Linear) -> None:
        with torch.no_grad():
            self.first_t, self.second_t = _transposed_copy(first.weight), _transposed_copy(second.weight)
            self.full_t = _transposed_copy(torch.block_diag(first.weight, second.weight))
            self.bias = torch.cat([first.bias, second.bias]).numpy()
        self.split_in, self.split_out = self.first_t.shape
        second_in, second_out = self.second_t.shape
        self.zero_block_work = self.split_in * second_out + second_in * self.split_out  # per row, in the full product

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim == 1 or x.shape[0] * self.zero_block_work < BLOCK_SPLIT_MIN_WASTE:
            out = x @ self.full_t
        else:
            out = np.empty((x.shape[0], self.bias.shape[0]), dtype=np.float32)
            np.matmul(x[:, :self.split_in], self.first_t, out=out[:, :self.split_out])
            np.matmul(x[:, self.split_in:], self.second_t, out=out[:, self.split_out:])
        out += self.bias
        return out


Layer = Dense | BlockDiagonal | str
"""A linear layer (``Dense``), a ``BlockDiagonal`` pair, or an activation name ("tanh", "relu")."""


def host_view(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy array sharing ``tensor``'s memory (a CPU float32 tensor; no copy)."""
    if tensor.device.type != "cpu" or tensor.dtype != torch.float32:
        raise ValueError(f"numpy_acting needs CPU float32 weights, got {tensor.dtype} on {tensor.device}")
    return tensor.detach().numpy()


class NumpyMLP:
    """A forward pass over (weight, bias) pairs and activations, in float32 NumPy."""

    def __init__(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor] | nn.Module]) -> None:
        if not layers or not isinstance(layers[0], (nn.Linear, tuple)):
            raise ValueError("NumpyMLP needs a linear first layer (its activations work in place)")
        self.layers: list[Layer] = []
        for layer in layers:
            if isinstance(layer, nn.Linear):
                layer = (layer.weight, layer.bias)
            if isinstance(layer, tuple):
                weight, bias = layer
                self.layers.append(Dense(host_view(weight), host_view(bias)))
            else:
                self.layers.append(ACTIVATION_NAMES[type(layer)])

    @classmethod
    def of(cls, mlp: MLP) -> NumpyMLP:
        """The NumPy forward of ``mlp``'s live parameters."""
        return cls(list(mlp))

    @classmethod
    def side_by_side(cls, first: MLP, second: MLP) -> NumpyMLP:
        """A snapshot of two MLPs of one layer pattern over the same input, as one forward whose
        output is their outputs side by side: the first layers concatenated (one product), each
        later pair a ``BlockDiagonal``. Build it again after the weights change."""
        pairs = list(zip(first, second))
        if len(first) != len(second) or any(type(a) is not type(b) for a, b in pairs):
            raise ValueError("side_by_side needs two MLPs with the same layer pattern")
        (a, b), rest = pairs[0], pairs[1:]
        with torch.no_grad():
            weight = torch.cat([a.weight, b.weight])
            head = Dense(weight.numpy(), torch.cat([a.bias, b.bias]).numpy(), _transposed_copy(weight))
        forward = cls.__new__(cls)
        forward.layers = [head] + [BlockDiagonal(a, b) if isinstance(a, nn.Linear) else ACTIVATION_NAMES[type(a)]
                                   for a, b in rest]
        return forward

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The output for a (rows, inputs) array (left unchanged; cast to float32 if it is not).
        One row runs as vectors (matrix-vector products)."""
        x = np.asarray(x, dtype=np.float32)
        single = x.shape[0] == 1
        if single:
            x = x[0]
        for layer in self.layers:
            if layer == "tanh":
                np.tanh(x, out=x)
            elif layer == "relu":
                relu_(x)
            else:  # a fresh array: the activations after it work in place
                x = layer(x)
        return x[None] if single else x


# --------------------------------------------------------------------------- NumPy forward and backward

@dataclass
class HostLinear:
    """A linear layer's weight and bias, and their gradients, as NumPy views of the torch tensors."""

    weight: np.ndarray
    bias: np.ndarray
    weight_grad: np.ndarray
    bias_grad: np.ndarray
    activation: str | None
    """The activation applied to this layer's input (None for the first layer)."""


class HostMLP:
    """An ``MLP``'s forward and hand-written backward in float32 NumPy over views of its
    parameters and of their ``.grad`` tensors (which must exist: the learner's flat buffer)."""

    def __init__(self, mlp: MLP) -> None:
        self.layers: list[HostLinear] = []
        activation: str | None = None
        for layer in mlp:
            if isinstance(layer, nn.Linear):
                if layer.weight.grad is None or layer.bias.grad is None:
                    raise ValueError("numpy_update writes into existing gradient tensors (the learner's flat buffer)")
                self.layers.append(HostLinear(host_view(layer.weight), host_view(layer.bias),
                                              host_view(layer.weight.grad), host_view(layer.bias.grad), activation))
                activation = None
            else:
                activation = ACTIVATION_NAMES[type(layer)]

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """The output for ``x`` (rows, inputs) and each linear layer's input, for ``backward``."""
        inputs: list[np.ndarray] = []
        for layer in self.layers:
            if layer.activation == "tanh":
                np.tanh(x, out=x)
            elif layer.activation == "relu":
                relu_(x)
            inputs.append(x)
            x = x @ layer.weight.T  # a fresh array: the next activation works in place
            x += layer.bias
        return x, inputs

    def backward(self, inputs: Sequence[np.ndarray], grad_out: np.ndarray) -> None:
        """Write every weight's and bias's gradient from d loss / d output (``mlp_backward``)."""
        for index in range(len(self.layers) - 1, -1, -1):
            layer, layer_input = self.layers[index], inputs[index]
            np.matmul(grad_out.T, layer_input, out=layer.weight_grad)
            column_sums(grad_out, out=layer.bias_grad)
            if index == 0:
                return
            grad_out = np.dot(grad_out, layer.weight)  # BLAS for a one-column gradient too (matmul is not)
            if layer.activation == "tanh":  # d tanh(z) = 1 - tanh(z)^2, from the saved output
                slope = np.square(layer_input)
                np.subtract(1.0, slope, out=slope)
                grad_out *= slope
            else:  # relu: the gradient passes where the output is positive
                grad_out *= layer_input > 0
