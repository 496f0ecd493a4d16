"""``optimizations.numpy_acting``: the acting forward of an MLP policy in NumPy, on the CPU.

At acting batch sizes (one to a few dozen rows) a torch op spends microseconds in dispatch
for nanoseconds of arithmetic, and a rollout step runs a dozen of them; a NumPy call costs
a fraction of that. The forward is ``nets.mlp.NumpyMLP`` (zero-copy NumPy views of CPU float32
weights, so an in-place optimiser step shows through without a copy); here are the NumPy kernels
around it (reductions, in-place ReLU), the row chunking, NumPy's BLAS thread count and the
action sampling. The random draws stay torch's (the same generator calls as the torch path), so
both paths see the same noise. Same maths with another BLAS and other elementwise kernels: the
fp-reorder parity class. Guarded by tests/test_numpy_acting.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController


LOG_2PI = math.log(2 * math.pi)
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


def in_chunks(forward: Callable[[np.ndarray], np.ndarray], x: np.ndarray, rows: int) -> np.ndarray:
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
