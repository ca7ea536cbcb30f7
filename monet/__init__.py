"""monet: memory-optimised training (MONeT, Shah et al., ICLR 2021) for PyTorch 2.x.

``monet.optimize(model, example_inputs, budget="50%")`` captures, costs, solves and returns the
wrapped model in one call; ``monet.MONeTWrapper(model, "file.monet")`` trains with a solution saved
before; ``monet.WithLoss(model, loss_fn)`` puts a loss in the graph.  The errors they raise are
importable from here too.  Everything is imported lazily, so that ``import monet`` (the CLI) does
not load torch before it sets up its environment.
"""
__version__ = "0.1.0"

# name -> module it lives in
_EXPORTS = {
    "optimize": "monet.plan",
    "prepare": "monet.plan",
    "Options": "monet.options",
    "WithLoss": "monet.with_loss",
    "MONeTWrapper": "monet.wrapper",
    "Solution": "monet.solution",
    "load_solution": "monet.solution",
    "InfeasibleBudgetError": "monet.solver.ilp",
    "SolutionMismatchError": "monet.errors",
    "SolutionFileError": "monet.errors",
    "AutocastMismatchError": "monet.errors",
    "CaptureError": "monet.frontend",
    "GraphBreakError": "monet.frontend",
    "ShardedModelError": "monet.frontend",
    "MonetWarning": "monet.terms",
    "BucketedWrapper": "monet.buckets",
    "PiecewiseModule": "monet.pieces",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'monet' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
