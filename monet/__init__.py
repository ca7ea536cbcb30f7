"""monet: memory-optimised training (MONeT, Shah et al., ICLR 2021) for PyTorch 2.x.

``monet.optimize(model, example_inputs, budget="50%")`` captures, costs, solves and returns the
wrapped model in one call; ``from monet import MONeTWrapper`` trains with a solution saved before.  Both
are imported lazily so that ``import monet`` (the CLI) does not load torch before it sets up its
environment.
"""
__version__ = "0.1.0"


def __getattr__(name):
    if name == "MONeTWrapper":
        from monet.wrapper import MONeTWrapper
        return MONeTWrapper
    if name == "optimize":
        from monet.plan import optimize
        return optimize
    raise AttributeError(f"module 'monet' has no attribute {name!r}")
