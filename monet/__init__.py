"""monet: memory-optimised training (MONeT, Shah et al., ICLR 2021) for PyTorch 2.x."""
__version__ = "0.1.0"
