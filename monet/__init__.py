"""monet: memory-optimised training (MONeT, Shah et al., ICLR 2021) for PyTorch 2.x.

``from monet import MONeTWrapper`` is the entry point for training with a solved schedule; it is
imported lazily so that ``import monet`` (the CLI) does not load torch before it sets up its
environment.
"""
__version__ = "0.1.0"


def __getattr__(name):
    if name == "MONeTWrapper":
        from monet.wrapper import MONeTWrapper
        return MONeTWrapper
    raise AttributeError(f"module 'monet' has no attribute {name!r}")
