"""The loss traced with the model: `WithLoss`, and the name a solution file records it by
(`loss_name`, `loss_from_name`)."""
from __future__ import annotations

import torch.nn as nn


class WithLoss(nn.Module):
    """``loss_fn(model(*args, **kwargs), target)`` as one module, so that the loss is in the graph
    (its backward starts from the scalar loss, as training does, and the loss's own temporaries are
    in the budget).

    ``monet.optimize(model, x, loss_fn=F.cross_entropy, target=y)`` captures ``WithLoss(model,
    F.cross_entropy)``; its solution records the loss by name (``solution.meta.loss``), and
    ``MONeTWrapper(model, file)`` wraps the model in ``WithLoss`` again itself.  Build one by hand
    for a loss that has no importable name (a lambda, a loss module with arguments):
    ``MONeTWrapper(WithLoss(model, my_loss), file)``.

    Args:
        model: the network; called as ``model(*args, **kwargs)``.
        loss_fn: ``loss_fn(output, target) -> scalar tensor`` (e.g. ``F.cross_entropy`` on logits
            (B, C) and classes (B,) int64).

    Called as ``with_loss(*args, target=y, **kwargs)``; returns the scalar loss.  ``state_dict``
    and ``load_state_dict`` use the model's own keys.
    """

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *args, target, **kwargs):
        return self.loss_fn(self.model(*args, **kwargs), target)

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)


def loss_name(loss_fn) -> str:
    """The importable name of a loss function, ``module.qualname`` (``F.cross_entropy``:
    ``"torch.nn.functional.cross_entropy"``); for a loss module, its class's name with ``()``
    (``"torch.nn.modules.loss.CrossEntropyLoss()"``).  What `SolutionMeta.loss` records."""
    if isinstance(loss_fn, nn.Module):
        cls = type(loss_fn)
        return f"{cls.__module__}.{cls.__qualname__}()"
    return f"{getattr(loss_fn, '__module__', '?')}.{getattr(loss_fn, '__qualname__', repr(loss_fn))}"


def loss_from_name(name: str):
    """The loss function `loss_name` gave ``name``, imported again; None where it cannot be (a
    lambda, a function defined inside another, a loss module: its arguments are not recorded)."""
    import importlib

    if name.endswith("()") or "<" in name:
        return None
    module, _, attr = name.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
        except ImportError:
            module, _, head = module.rpartition(".")
            attr = f"{head}.{attr}"
            continue
        for part in attr.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj if callable(obj) else None
    return None


__all__ = ["WithLoss", "loss_from_name", "loss_name"]
