"""``optimizations.numpy_acting``: the acting forward of an MLP policy in NumPy, on the CPU.

At acting batch sizes (one to a few dozen rows) a torch op spends microseconds in dispatch
for nanoseconds of arithmetic, and a rollout step runs a dozen of them; a NumPy call costs
a fraction of that. ``NumpyMLP`` multiplies by zero-copy NumPy views of CPU float32 weights,
so an in-place optimiser step shows through without a copy. The random draws stay torch's
(the same generator calls as the torch path), so both paths see the same noise. Same maths
with another BLAS and other elementwise kernels: the fp-reorder parity class. Guarded by
tests/test_numpy_acting.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from threadpoolctl import ThreadpoolController
from torch import nn

from reference_trainers.nets.analytic import ACTIVATION_NAMES
from reference_trainers.nets.networks import MLP

LOG_2PI = math.log(2 * math.pi)
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


class NumpyBlasThreads:
    """NumPy's own BLAS thread count, one while a NumPy-acting trainer runs (``apply``).

    Acting products are small enough for one thread; left at its default, NumPy's BLAS wakes
    its worker threads for a 64-row product and they spin beside torch's threads through the
    update that follows, slowing it down on a machine with few cores. Only the
    BLAS library that NumPy itself loaded is limited, never torch's.
    """

    def __init__(self) -> None:
        self._original: list[tuple[Any, int]] | None = None  # (library, its thread count) while limited

    def apply(self, single: bool) -> None:
        """One thread for NumPy's BLAS if ``single``, else its original count; O(1) when unchanged."""
        if single == (self._original is not None):
            return
        if single:
            libraries = ThreadpoolController().select(user_api="blas").lib_controllers
            self._original = [(lib, lib.num_threads) for lib in libraries if "numpy" in lib.filepath]
            for lib, _ in self._original:
                lib.set_num_threads(1)
        else:
            for lib, threads in self._original:
                lib.set_num_threads(threads)
            self._original = None


numpy_blas_threads = NumpyBlasThreads()
"""The process's one switch (process-wide state, like torch's thread count)."""


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


@functools.lru_cache(maxsize=64)
def _filled(shape: tuple[int, ...], value: float, dtype: np.dtype = np.dtype(np.float32)) -> np.ndarray:
    """A read-only array of ``value`` (one per shape, value and dtype, kept: no allocation per call)."""
    array = np.full(shape, value, dtype=dtype)
    array.flags.writeable = False
    return array


def relu_(x: np.ndarray) -> None:
    """ReLU in place. NumPy's maximum against a scalar takes a slower loop than against an array
    of the same shape, so the zeros come as one. NaN stays NaN either way."""
    np.maximum(x, _filled(x.shape, 0.0), out=x)


def chunk_rows(batch_inference: bool, inference_batch_size: int | None, num_envs: int) -> int:
    """Rows per forward: one (per sub-env, the plain path), ``inference_batch_size``, or all."""
    return (inference_batch_size or num_envs) if batch_inference else 1


def in_chunks(forward: NumpyMLP, x: np.ndarray, rows: int) -> np.ndarray:
    """``forward`` over ``x`` in slices of ``rows`` rows (one call when they all fit)."""
    if rows >= x.shape[0]:
        return forward(x)
    return np.concatenate([forward(x[start:start + rows]) for start in range(0, x.shape[0], rows)])


_ROW_LOOP_MAX = 16
"""Up to this many columns, ``row_max`` and the categorical sample's running sum go column by
column (one NumPy call per column); wider arrays take NumPy's own reductions."""


def column_sums(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The sum of each column of ``a`` (rows, columns) as one matrix-vector product: NumPy's
    reduction over the rows of a C-ordered array is several times slower."""
    return np.matmul(_filled((len(a),), 1.0, a.dtype), a, out=out)


def row_sums(a: np.ndarray) -> np.ndarray:
    """The sum of each row of ``a`` (rows, columns) as one matrix-vector product (a NumPy
    reduction over a short last axis walks row by row)."""
    return a @ _filled((a.shape[-1],), 1.0, a.dtype)


def row_max(a: np.ndarray) -> np.ndarray:
    """The maximum of each row of ``a`` (rows, columns); column by column for a few columns."""
    if a.shape[-1] > _ROW_LOOP_MAX or a.shape[-1] == 1:
        return a.max(-1)
    out = np.maximum(a[:, 0], a[:, 1])
    for column in range(2, a.shape[-1]):
        np.maximum(out, a[:, column], out=out)
    return out


@functools.lru_cache(maxsize=64)
def _row_starts(rows: int, columns: int) -> np.ndarray:
    """The flat index of each row's first element in a C-ordered (rows, ``columns``) array (kept, read-only)."""
    starts = np.arange(rows, dtype=np.intp) * columns
    starts.flags.writeable = False
    return starts


def taken_index(actions: np.ndarray, columns: int) -> np.ndarray:
    """Flat indices of each row's taken action in a C-ordered (rows, ``columns``) array."""
    return _row_starts(len(actions), columns) + actions.astype(np.intp, copy=False)


def sample_categorical(logits: np.ndarray, uniform: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ppo.sample_action`` for logits in NumPy: the first action whose cumulative probability
    reaches ``uniform`` (one per row), and its log-probability (float32)."""
    shifted = logits - row_max(logits)[:, None]
    scratch = np.exp(shifted)
    log_probs = shifted - np.log(row_sums(scratch))[:, None]
    probs = np.exp(log_probs, out=scratch)
    columns = logits.shape[-1]
    if columns > _ROW_LOOP_MAX or columns == 1:
        action = (probs.cumsum(-1) < uniform[:, None]).sum(-1)
        np.minimum(action, columns - 1, out=action)
    else:  # the running sum column by column: cumsum's additions, in its order. The last column's
        # sum is left out: the running sum never falls (probabilities are >= 0), so it passes
        # ``uniform`` only in rows where every earlier sum has, which already count columns - 1,
        # the most the count may reach (cumsum's count is clipped there)
        running = probs[:, 0]
        action = (running < uniform).astype(np.intp)
        if columns > 2:
            running = running.copy()
            for column in range(1, columns - 1):
                running += probs[:, column]
                action += running < uniform
    return action, log_probs.take(taken_index(action, columns))


def sample_gaussian(mean: np.ndarray, log_std: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ppo.sample_action`` for a diagonal Gaussian in NumPy: ``mean + std * noise`` and its log-density."""
    action = mean + np.exp(log_std) * noise
    log_prob = (-0.5 * np.square(noise) - log_std - np.float32(0.5 * LOG_2PI)).sum(-1, dtype=np.float32)
    return action, log_prob
