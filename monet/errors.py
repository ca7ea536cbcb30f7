"""The errors a solution file raises when it cannot be read or does not fit the model.

They live apart from `monet.solution` so that the zoo's index (`monet.zoo.index`), which
`monet.solution.load_solution` reads to resolve ``"zoo:NAME"``, can raise them without importing it.
"""
from __future__ import annotations


class SolutionFileError(ValueError):
    """A file that cannot be read as a monet solution; the message names the file and the reason."""


class SolutionMismatchError(ValueError):
    """A solution made for another graph (model, batch size, input shape, dtype or ops)."""


class AutocastMismatchError(SolutionMismatchError, RuntimeError):
    """A solution run under another autocast setting than it was solved for (an fp32 solution under
    ``torch.autocast``, a bf16 one without it ...); the message names both and what to do."""


__all__ = ["SolutionFileError", "SolutionMismatchError", "AutocastMismatchError"]
