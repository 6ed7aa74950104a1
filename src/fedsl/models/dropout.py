"""Counter-based dropout: the mask is a pure function of (key, layer, element).

Why not ``nn.Dropout``: its mask comes from torch's global RNG, so a vmapped round
(randomness='different') and a sequential loop over the same clients draw different
masks, and a resumed run would need the RNG state. Here each training step passes an
integer *key* (derived from seed, round, client and step), and the mask is a hash of
that key and the element's position. Same key => same mask on any executor or device.
"""

from __future__ import annotations

import torch
from torch import nn

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser (lowbias32-like) on int64 tensors holding 32-bit values.

    Multipliers are kept below 2**31 so the products fit in int64 without overflow.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    x = x ^ (x >> 16)
    return x


def keyed_uniform(key: torch.Tensor, salt: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """Uniform numbers in [0, 1) of ``shape``, determined by (key, salt, position)."""
    n = 1
    for s in shape:
        n *= s
    pos = torch.arange(n, dtype=torch.int64, device=key.device)
    seed = _mix32((key & _M32) ^ ((salt * 0x5BD1E995 + 0x68E31DA4) & _M32))
    bits = _mix32(((pos * 0x2545F491) & _M32) ^ seed)
    bits = _mix32(bits + seed)
    return (bits.to(torch.float64) * (1.0 / 2**32)).to(dtype).reshape(shape)


class KeyedDropout(nn.Module):
    """Dropout with probability ``p`` whose mask is drawn from the buffer ``key``.

    The engine sets ``key`` per (client, step) through ``torch.func.functional_call``;
    under ``vmap`` the key is batched, so every client gets its own mask.
    """

    def __init__(self, p: float, salt: int) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p = {p!r}: expected 0 <= p < 1")
        self.p = float(p)
        self.salt = int(salt)
        self.register_buffer("key", torch.zeros((), dtype=torch.int64), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = keyed_uniform(self.key, self.salt, x.shape, x.dtype) >= self.p
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        return f"p={self.p}, salt={self.salt}"


def replace_dropout(model: nn.Module) -> list[str]:
    """Swap every ``nn.Dropout`` in ``model`` for a ``KeyedDropout`` (in place).

    Returns the buffer names (``"<module>.key"``) the engine must feed a key to.
    """
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, child_name, KeyedDropout(child.p, salt=0))
    # salts in module order, unique per layer, so two layers never share a mask
    names = [n for n, m in model.named_modules() if isinstance(m, KeyedDropout)]
    for i, n in enumerate(names):
        model.get_submodule(n).salt = i + 1
    return [f"{n}.key" for n in names]
