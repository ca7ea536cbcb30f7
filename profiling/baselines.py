"""The methods MONeT is compared with (docs/design.md, "Measuring"; ``monet demo`` and the benchmarks),
each a module that trains the same model.

* `chen_sqrt_checkpoint`: Chen et al. 2016 ("Training Deep Nets with Sublinear Memory Cost"):
  split the network into about sqrt(n) segments of its n sequential units, keep only each
  segment's input and recompute the segment during the backward pass, with
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.
* `compile_with_activation_budget`: ``torch.compile(model, backend="aot_eager_decomp_partition")``
  (or ``"inductor"``, the compiled peers of ``monet.optimize(..., compile=True)``) with
  ``torch._functorch.config.activation_memory_budget`` set while the graph is partitioned
  (PyTorch's own knapsack-based recompute-or-save choice; 1.0 keeps what the default partitioner
  keeps, 0.0 recomputes everything that can be recomputed).

Both return an ``nn.Module`` that holds the original model (so it shares parameters and buffers
with it) and is called exactly like it: ``peer(x).backward(g)``.

Segmentation for Chen's method
------------------------------
``checkpoint_sequential`` needs an ``nn.Sequential``; none of the zoo models is one, so each zoo
model class has an explicit list of units in `SEGMENTATIONS` (a unit is a callable from one tensor
to the next, reproducing the model's own ``forward`` op for op):

=============  ================================================================================
ResNet         stem (conv1, bn1, relu, maxpool), every bottleneck of layer1..layer4, head
               (avgpool, flatten, fc): 3 + 4 + 6 + 3 + 2 = 18 units for ResNet-50
VGG            each 3x3 convolution with its in-place ReLU (and the max-pool that follows it),
               head (avgpool, flatten, classifier): 14 units for VGG-16
MobileNetV2    every block of ``features`` (stem, 17 inverted residuals, last 1x1), head: 20 units
GoogLeNet      conv1, maxpool1, conv2, conv3, maxpool2, the 9 inceptions and maxpool3/4, head:
               17 units
GPT2           embeddings (wte + wpe + dropout), the transformer blocks, head (ln_f, tied
               linear): 14 units for GPT-2 small
nn.Sequential  its children
=============  ================================================================================

A unit never starts with an in-place op, so no segment overwrites the input that the checkpoint
keeps for recomputation.  ``segments = round(sqrt(n))``; the units are cut as
``checkpoint_sequential`` cuts them (``n // segments`` units per segment, the last segment --
holding the remainder -- runs without checkpointing, since its activations are needed first in
the backward pass).  We run that loop ourselves rather than calling ``checkpoint_sequential``
because the latter does not pass ``context_fn`` on to ``checkpoint`` (torch 2.13), and
``context_fn`` is how BatchNorm is kept right (below).

U-Net is not sequential (its skip connections cross the whole network), so the sqrt(n) cut does
not apply: each encoder and decoder block (inc, down1..4, up1..4) is checkpointed on its own; the
block outputs (which the skip connections need anyway) are kept, everything inside a block is
recomputed.  The 1x1 output convolution is not checkpointed.

BatchNorm under checkpointing
-----------------------------
``torch.utils.checkpoint`` (reentrant or not) recomputes a segment by running its forward again,
in training mode, so every BatchNorm in a recomputed segment updates ``running_mean`` /
``running_var`` a second time and increments ``num_batches_tracked`` again (checked with torch
2.13; the gradients are unaffected since training-mode BatchNorm normalises with the batch
statistics).  After one step the running statistics are then those of two momentum updates with
the same batch statistics.  With ``restore_bn_stats=True`` (the default) the recomputation
runs inside a context (``context_fn``'s second context manager) that saves every BatchNorm
buffer of the model before the recomputation and writes it back afterwards, so the running
statistics equal plain PyTorch's exactly; the extra memory is one copy of the BatchNorm buffers
(kilobytes).  ``restore_bn_stats=False`` is plain ``torch.utils.checkpoint`` behaviour.
Random ops (dropout) are replayed exactly (``preserve_rng_state=True``).

Library models (torchvision, timm, transformers)
------------------------------------------------
`checkpoint_blocks` patches a model in place, found by attribute names rather than by class: a
sequence of one-tensor units (an ``nn.Sequential`` named ``features``, ``blocks``, ``stages`` or
``layers``, or the children of consecutive ``layer1``, ``layer2``... / ``stage2``, ``stage3``...
Sequentials) is cut into round(sqrt(n)) segments as above; a list of transformer blocks called with
keyword arguments (the first ``nn.ModuleList`` named ``h``, ``layer``, ``layers`` or ``blocks``:
``transformer.h``, ``model.layers``, ``bert.encoder.layer``, ``vit.layers``...) cannot be grouped from outside the model's own
loop, so each block is checkpointed on its own (segments of one block, as transformers'
``gradient_checkpointing_enable`` does).  BatchNorm statistics are not restored there (plain
``torch.utils.checkpoint``).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Sequence

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

from monet.compat import activation_memory_budget, dynamo_backend

__all__ = ["SEGMENTATIONS", "sequential_units", "ChenCheckpointed", "chen_sqrt_checkpoint", "chen_checkpoint",
           "checkpoint_blocks", "CompiledWithBudget", "compile_with_activation_budget", "compiled_alone"]

Unit = Callable[[torch.Tensor], torch.Tensor]


# ----------------------------------------------------------------------------------------------
# units per zoo model
# ----------------------------------------------------------------------------------------------


def _resnet_units(m) -> list[Unit]:
    stem = lambda x: m.maxpool(m.relu(m.bn1(m.conv1(x))))  # noqa: E731
    head = lambda x: m.fc(torch.flatten(m.avgpool(x), 1))  # noqa: E731
    blocks = [b for layer in (m.layer1, m.layer2, m.layer3, m.layer4) for b in layer]
    return [stem, *blocks, head]


def _vgg_units(m) -> list[Unit]:
    units: list[list[nn.Module]] = []
    for layer in m.features:
        if isinstance(layer, nn.Conv2d) or not units:
            units.append([layer])
        else:  # the in-place ReLU and the max-pool join the convolution before them
            units[-1].append(layer)
    head = lambda x: m.classifier(torch.flatten(m.avgpool(x), 1))  # noqa: E731
    return [nn.Sequential(*u) for u in units] + [head]


def _mobilenet_units(m) -> list[Unit]:
    head = lambda x: m.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(x, (1, 1)), 1))  # noqa: E731
    return [*m.features, head]


def _googlenet_units(m) -> list[Unit]:
    names = ["conv1", "maxpool1", "conv2", "conv3", "maxpool2", "inception3a", "inception3b", "maxpool3",
             "inception4a", "inception4b", "inception4c", "inception4d", "inception4e", "maxpool4",
             "inception5a", "inception5b"]
    head = lambda x: m.fc(m.dropout(torch.flatten(m.avgpool(x), 1)))  # noqa: E731
    return [getattr(m, n) for n in names] + [head]


def _gpt2_units(m) -> list[Unit]:
    def embed(idx):
        seq = idx.shape[1]
        if seq > m.n_positions:
            raise ValueError(f"sequence length {seq} exceeds n_positions={m.n_positions}")
        return m.drop(m.wte(idx) + m.wpe(torch.arange(seq, device=idx.device)))

    head = lambda x: nn.functional.linear(m.ln_f(x), m.wte.weight)  # noqa: E731
    return [embed, *m.h, head]


def _segmentations() -> dict[type, Callable[[nn.Module], list[Unit]]]:
    from monet.zoo.models import GPT2, VGG, GoogLeNet, MobileNetV2, ResNet
    return {ResNet: _resnet_units, VGG: _vgg_units, MobileNetV2: _mobilenet_units,
            GoogLeNet: _googlenet_units, GPT2: _gpt2_units, nn.Sequential: lambda m: list(m)}


#: model class -> function giving its sequential units (see the module docstring).  U-Net is
#: handled separately (per-block checkpointing).
SEGMENTATIONS = _segmentations()


def sequential_units(model: nn.Module) -> list[Unit]:
    """The sequential units of a zoo model or an ``nn.Sequential`` (see the module docstring).

    Raises:
        ValueError: for a model whose class has no entry in `SEGMENTATIONS` (U-Net included:
            it is not sequential).
    """
    for cls, fn in SEGMENTATIONS.items():
        if isinstance(model, cls):
            return fn(model)
    raise ValueError(f"no sequential segmentation is known for {type(model).__name__}; known: "
                     f"{', '.join(c.__name__ for c in SEGMENTATIONS)} (and UNet, checkpointed per block)")


# ----------------------------------------------------------------------------------------------
# Chen's sqrt(n) checkpointing
# ----------------------------------------------------------------------------------------------


class _RestoreBatchNormStats:
    """Context manager: BatchNorm buffers of ``model`` are written back on exit to their state on entry."""

    def __init__(self, bns: Sequence[_BatchNorm]):
        self.bns = bns
        self.saved: list = []

    def __enter__(self):
        with torch.no_grad():
            self.saved = [[(b, b.detach().clone()) for b in (bn.running_mean, bn.running_var,
                                                             bn.num_batches_tracked) if b is not None]
                          for bn in self.bns]
        return self

    def __exit__(self, *exc):
        with torch.no_grad():  # also when early stopping ends the recomputation with an exception
            for pairs in self.saved:
                for buf, old in pairs:
                    buf.copy_(old)
        self.saved = []
        return False


class _NullContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _segment(units: Sequence[Unit]) -> Unit:
    def run(x):
        for u in units:
            x = u(x)
        return x
    return run


class ChenCheckpointed(nn.Module):
    """``model`` trained with Chen's sqrt(n) checkpointing (see the module docstring).

    In training mode with gradients enabled the forward pass keeps only segment inputs (U-Net:
    block outputs); otherwise it is ``model(x)``.  Parameters and buffers are the model's, under
    the prefix ``model.``.

    Attributes:
        n_units: sequential units (0 for U-Net).
        segments: checkpointed segments + the final unchecked one (U-Net: checkpointed blocks).
    """

    def __init__(self, model: nn.Module, segments: int | None = None, restore_bn_stats: bool = True):
        super().__init__()
        from monet.zoo.models import UNet
        self.model = model
        self.restore_bn_stats = restore_bn_stats
        self._bns = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
        self._is_unet = isinstance(model, UNet)
        if self._is_unet:
            self._units: list[Unit] = []
            self.n_units = 0
            self.segments = 9
        else:
            self._units = sequential_units(model)
            self.n_units = len(self._units)
            self.segments = max(1, min(self.n_units, segments or round(math.sqrt(self.n_units))))

    def _context_fn(self):
        recompute = _RestoreBatchNormStats(self._bns) if (self.restore_bn_stats and self._bns) else _NullContext()
        return _NullContext(), recompute

    def _ckpt(self, fn, *args):
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, context_fn=self._context_fn)

    def _forward_unet(self, x):
        m = self.model
        x1 = self._ckpt(m.inc, x)
        x2 = self._ckpt(m.down1, x1)
        x3 = self._ckpt(m.down2, x2)
        x4 = self._ckpt(m.down3, x3)
        x = self._ckpt(m.down4, x4)
        x = self._ckpt(m.up1, x, x4)
        x = self._ckpt(m.up2, x, x3)
        x = self._ckpt(m.up3, x, x2)
        x = self._ckpt(m.up4, x, x1)
        return m.outc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.training and torch.is_grad_enabled()):
            return self.model(x)
        if self._is_unet:
            return self._forward_unet(x)
        # the cut of torch.utils.checkpoint.checkpoint_sequential
        units, size = self._units, len(self._units) // self.segments
        end = -1
        for start in range(0, size * (self.segments - 1), size):
            end = start + size - 1
            x = self._ckpt(_segment(units[start:end + 1]), x)
        return _segment(units[end + 1:])(x)

    def extra_repr(self) -> str:
        if self._is_unet:
            return "U-Net: 9 blocks checkpointed individually"
        return f"{self.n_units} units in {self.segments} segments, restore_bn_stats={self.restore_bn_stats}"


def chen_sqrt_checkpoint(model: nn.Module, segments: int | None = None,
                         restore_bn_stats: bool = True) -> ChenCheckpointed:
    """Chen et al.'s sqrt(n) checkpointing of ``model`` with ``torch.utils.checkpoint``.

    Args:
        model: a zoo model (ResNet, VGG, MobileNetV2, GoogLeNet, U-Net, GPT2) or an ``nn.Sequential``.
        segments: number of segments; ``round(sqrt(n))`` for n units by default (ignored for U-Net).
        restore_bn_stats: undo the second BatchNorm running-statistics update made by the
            recomputation (see the module docstring).

    Raises:
        ValueError: for a model without a known segmentation.
    """
    return ChenCheckpointed(model, segments, restore_bn_stats)


# ----------------------------------------------------------------------------------------------
# library models: sequences and block lists found by name
# ----------------------------------------------------------------------------------------------

SEQUENCES = ("features", "blocks", "stages", "layers")
STAGE_PREFIXES = ("layer", "stage")
BLOCK_LISTS = ("h", "layer", "layers", "blocks")


def _unit_chain(model: nn.Module) -> tuple[list[nn.Module], str] | None:
    """The model's one-tensor units called one after the other, and where they were found."""
    for name in SEQUENCES:
        seq = getattr(model, name, None)
        if isinstance(seq, nn.Sequential) and len(seq) > 1:
            return list(seq), f"`{name}`"
    for prefix in STAGE_PREFIXES:
        stages = sorted((int(n[len(prefix):]), n, c) for n, c in model.named_children()
                        if n.startswith(prefix) and n[len(prefix):].isdigit() and isinstance(c, nn.Sequential))
        if len(stages) > 1:
            return [u for _, _, s in stages for u in s], f"`{stages[0][1]}`..`{stages[-1][1]}`"
    return None


def _block_list(model: nn.Module) -> tuple[nn.ModuleList, str] | None:
    for path, blocks in model.named_modules():
        if isinstance(blocks, nn.ModuleList) and len(blocks) and path.rsplit(".", 1)[-1] in BLOCK_LISTS:
            return blocks, f"`{path}`"
    return None


def _checkpointed_call(fn, *args, **kwargs):
    return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def _identity(x):
    return x


def checkpoint_blocks(model: nn.Module, segments: int | None = None) -> str:
    """Chen's checkpointing on a torchvision, timm or transformers model, patched in place (the
    module docstring says which sequences are found); returns what was checkpointed, in words.

    Raises:
        ValueError: no sequence of units and no list of blocks found (the message names where it looked).
    """
    chain = _unit_chain(model)
    if chain is not None:
        units, where = chain
        n = len(units)
        segments = max(1, min(n, segments or round(math.sqrt(n))))
        size, forwards = n // segments, [u.forward for u in units]
        for start in range(0, size * (segments - 1), size):  # the cut of checkpoint_sequential
            units[start].forward = partial(_checkpointed_call, _segment(forwards[start:start + size]))
            for u in units[start + 1:start + size]:
                u.forward = _identity
        return f"{n} units of {where} in {segments} segments"
    found = _block_list(model)
    if found is not None:
        blocks, where = found
        for b in blocks:
            b.forward = partial(_checkpointed_call, b.forward)
        return f"each of the {len(blocks)} blocks of {where} (a block list: no sqrt(n) grouping)"
    raise ValueError(f"no sequence of units ({', '.join(SEQUENCES)}, {'N/'.join(STAGE_PREFIXES)}N) "
                     f"and no nn.ModuleList named {', '.join(BLOCK_LISTS)} in {type(model).__name__}")


# ----------------------------------------------------------------------------------------------
# torch.compile with activation_memory_budget
# ----------------------------------------------------------------------------------------------


def compiled_alone(model: nn.Module, backend: str = "inductor") -> nn.Module:
    """``torch.compile(model, backend=backend)`` through a backend function of its own: Dynamo
    guards each cache entry on the backend object, so no graph another ``torch.compile`` call
    compiled (another copy of the same model class, under another budget) is reused."""
    compiler = dynamo_backend(backend)
    return torch.compile(model, backend=lambda gm, example_inputs: compiler(gm, example_inputs))


class CompiledWithBudget(nn.Module):
    """``torch.compile(model, backend=backend)`` partitioned under a budget.

    Every call runs inside ``torch._functorch.config.patch(activation_memory_budget=budget)``, so
    the first call's compilation -- and any later recompilation -- partitions the joint graph
    with this budget.  The backend is called through a function of this instance's own: Dynamo
    guards each cache entry on the backend object it was compiled with, so no graph another
    ``torch.compile`` call compiled is reused (with the backend's name, a copy of the same model
    class ran the first copy's graph, whatever its budget).  ``reset``: also
    ``torch.compiler.reset()`` on construction (it clears Dynamo's caches for every compiled
    module in the process).
    """

    def __init__(self, model: nn.Module, budget: float, backend: str = "aot_eager_decomp_partition",
                 reset: bool = True):
        super().__init__()
        if not (0.0 <= float(budget) <= 1.0):
            raise ValueError(f"activation_memory_budget must lie in [0, 1], got {budget}")
        self.budget = float(budget)
        if reset:
            torch.compiler.reset()
        self.model = model
        self.backend = backend
        self.compiled = compiled_alone(model, backend)

    def forward(self, *args, **kwargs):
        with activation_memory_budget(self.budget):
            return self.compiled(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"activation_memory_budget={self.budget}, backend={self.backend}"


def compile_with_activation_budget(model: nn.Module, budget: float, backend: str = "aot_eager_decomp_partition",
                                   reset: bool = True) -> CompiledWithBudget:
    """``model`` compiled with ``backend`` (default aot_eager_decomp_partition: the partitioner with
    eager kernels; ``"inductor"``: ``torch.compile``'s default) at ``activation_memory_budget=budget``.

    Args:
        model: any model ``torch.compile`` can trace.
        budget: fraction in [0, 1] of the default partitioner's saved activations to keep.
        backend, reset: as `CompiledWithBudget` takes them.
    """
    return CompiledWithBudget(model, budget, backend, reset)


def chen_checkpoint(model: nn.Module) -> tuple[nn.Module, str]:
    """Chen's checkpointing of any model: `chen_sqrt_checkpoint` for a model with a known
    segmentation (zoo models, ``nn.Sequential``), else `checkpoint_blocks` (``model`` patched in
    place).  Returns (the module to train, what was checkpointed, in words).

    Raises:
        ValueError: neither applies (the message says where `checkpoint_blocks` looked).
    """
    try:
        wrapped = chen_sqrt_checkpoint(model)
    except ValueError:
        return model, checkpoint_blocks(model)
    return wrapped, wrapped.extra_repr()
