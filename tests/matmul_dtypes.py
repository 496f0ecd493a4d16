"""A dispatch-level probe of the dtypes a network's matmuls and convolutions run in."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class MatmulDtypes(TorchDispatchMode):
    """Records (grad mode, output dtype) of every matmul and convolution run inside it.

    Dispatch level, so it sees layers whatever calls them (module, ``F.linear`` or a stacked
    network), unlike forward hooks on individual modules.
    """

    OPS = {"addmm", "mm", "bmm", "convolution"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, torch.dtype]] = []

    @property
    def dtypes(self) -> set[torch.dtype]:
        return {dtype for _, dtype in self.seen}

    def dtypes_where(self, grad_enabled: bool) -> set[torch.dtype]:
        return {dtype for grad, dtype in self.seen if grad == grad_enabled}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.OPS:
            self.seen.append((torch.is_grad_enabled(), out.dtype))
        return out
