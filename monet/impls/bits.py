"""Bit and nibble packing for compact activation storage (masks, pooling offsets)."""
import math

import torch


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Pack a bool tensor, 8 elements per byte.

    mask: bool, any shape, numel n. Returns a flat uint8 tensor of length ceil(n / 8)
    (ceil(n / 8) bytes) on mask's device: element k (row-major order) is bit k % 8 of
    byte k // 8 (little-endian); the tail of the last byte is zero. No errors raised.
    """
    n = mask.numel()
    flat = mask.reshape(-1).to(torch.uint8)
    flat = torch.nn.functional.pad(flat, (0, (-n) % 8))
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    return (flat.view(-1, 8) << shifts).sum(-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of pack_bits: flat uint8 of length >= ceil(prod(shape) / 8) -> contiguous
    bool tensor of `shape` (1 byte per element) on packed's device."""
    n = math.prod(shape)
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.reshape(-1, 1) >> shifts) & 1
    return bits.reshape(-1)[:n].to(torch.bool).reshape(shape)


def pack_nibbles(values: torch.Tensor) -> torch.Tensor:
    """Pack uint8 values in [0, 15], 2 per byte.

    values: uint8, any shape, numel n. Returns a flat uint8 tensor of length ceil(n / 2)
    (ceil(n / 2) bytes): element k is the low nibble of byte k // 2 if k is even, the high
    nibble if odd. Values above 15 are not checked (their high bits corrupt the neighbour).
    """
    n = values.numel()
    flat = torch.nn.functional.pad(values.reshape(-1).to(torch.uint8), (0, n % 2)).view(-1, 2)
    return flat[:, 0] | (flat[:, 1] << 4)


def unpack_nibbles(packed: torch.Tensor, shape) -> torch.Tensor:
    """Inverse of pack_nibbles: flat uint8 -> contiguous uint8 tensor of `shape`, values in [0, 15]."""
    n = math.prod(shape)
    both = torch.stack([packed & 15, packed >> 4], dim=-1)
    return both.reshape(-1)[:n].reshape(shape)
