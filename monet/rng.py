"""Recomputing random ops (dropout): replay the generator state they drew from.

A random op (``aten.native_dropout`` and the other ops tagged ``nondeterministic_seeded``) draws
from its device's default generator.  Recomputed in the backward pass as it stands, it would draw a
different mask.  The executor therefore, for each random op the schedule recomputes, saves the
generator state right before the op runs in the forward pass (`rng_state`: 5,056 bytes on CPU,
16 bytes on CUDA) and recomputes it with that state (`with_rng_state`), restoring the generator
afterwards: the mask is the forward pass's, bit for bit, and the random numbers drawn after the
step are the ones plain PyTorch would draw.  This is what ``torch.utils.checkpoint`` does with
``preserve_rng_state=True``.
"""
from __future__ import annotations

import torch

# name of a saved generator state in the executor's modules: STATE_PREFIX + the random op's FX name
STATE_PREFIX = "monet_rng_state_"


def _get(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    if device.type == "cpu":
        return torch.get_rng_state()
    raise NotImplementedError(f"recomputing a random op on {device.type} is not supported; "
                              "keep its output (a schedule without recomputation of dropout)")


def _set(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def rng_state(device: str) -> torch.Tensor:
    """The default generator state of ``device`` ("cpu", "cuda:0"): a uint8 tensor on the CPU
    (5,056 bytes for the CPU generator, 16 for a CUDA one: seed and offset).

    Raises:
        NotImplementedError: a device other than CPU or CUDA.
    """
    return _get(torch.device(device))


def state_meta(device: str) -> torch.Tensor:
    """A tensor on the meta device shaped like ``device``'s generator state (`rng_state`): the
    traced value (``meta['val']``) of a saved state, for the simulator and the ILP's memory model.
    A graph traced on the meta device (solving for a GPU without one) gets the CPU generator's
    size, the larger: an upper bound wherever the schedule runs."""
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        # a CUDA graph simulated without a GPU (a recorded trace, `monet.profiling.trace`): the CUDA
        # generator's state is its seed and offset, 8 bytes each (CUDAGeneratorImpl::get_state)
        return torch.empty(16, dtype=torch.uint8, device="meta")
    state = rng_state("cpu" if dev.type == "meta" else device)
    return torch.empty(state.shape, dtype=state.dtype, device="meta")


def with_rng_state(state: torch.Tensor, device: str, op, *args, **kwargs):
    """``op(*args, **kwargs)`` drawing from ``device``'s generator set to ``state`` (from
    `rng_state`); the generator's state is restored afterwards, so later draws are unchanged."""
    dev = torch.device(device)
    before = _get(dev)
    _set(dev, state)
    try:
        return op(*args, **kwargs)
    finally:
        _set(dev, before)


class Replay:
    """The target of a recomputed random op's FX node: ``Replay(op, device)(state, *args)`` is
    `with_rng_state`.  An FX node cannot take a Python function (an implementation's kernel) as
    an argument, so the op is bound here; ``__name__`` names it in the generated code."""

    def __init__(self, op, device: str):
        self.op, self.device = op, device
        self.__name__ = "replay_" + getattr(op, "__name__", "op").replace(".", "_")
        # while the op runs, the generator's own state is held to be restored (`with_rng_state`)
        self.scratch_bytes = state_meta(device).nbytes

    def __call__(self, state: torch.Tensor, *args, **kwargs):
        return with_rng_state(state, self.device, self.op, *args, **kwargs)


def random_op_device(node) -> str:
    """The device an FX node's random op draws on ("cpu", "cuda:0"): the device of its first traced
    tensor output (``meta['val']``).

    Raises:
        ValueError: the node has no traced tensor output (not from AOTAutograd's trace).
    """
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    for v in vals:
        if isinstance(v, torch.Tensor):
            return str(v.device)
    raise ValueError(f"random op {node.name} has no traced tensor output (meta['val']); "
                     "cannot tell which device's generator to replay")
