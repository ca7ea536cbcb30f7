"""One budget split among graphs that run one after another: the pieces of a model with graph
breaks (`monet.pieces`, docs/design.md Note [Pieces under one budget]).

Piece k runs while the pieces before it hold what they keep for their backward, beside bytes that
do not depend on any schedule (``fixed[k]``: other parameters, gradients, inputs).  Each piece offers
a few schedules (`Option`: its own peak, what it keeps, its predicted seconds); `split` picks one per
piece with the least total seconds such that, for every k,

    fixed[k] + sum(kept of the options picked for the pieces before k) + peak of k's option <= budget.

A dynamic program over the pieces in order, whose state is (bytes kept so far, seconds so far):
of the states with equal or more bytes kept, only one with fewer seconds survives (a Pareto front),
so the work is at most pieces x options x front size.  Exact over the options offered.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """One schedule of one piece: ``peak`` (bytes) its own predicted peak, ``kept`` (bytes) what its
    forward keeps for its backward, ``seconds`` its predicted time; ``ref``: the caller's handle."""

    peak: int
    kept: int
    seconds: float
    ref: object = None


@dataclass(frozen=True)
class Split:
    """`split`'s answer: ``picks[k]``, the index of the option picked for piece k (empty when none
    fits); ``failed``: the first piece no option of fits beside the cheapest-kept choices before it
    (None when it fits); ``seconds``: the picks' total; ``peak``: the largest
    ``fixed[k] + kept before k + peak of k`` (bytes)."""

    picks: tuple[int, ...]
    failed: int | None
    seconds: float
    peak: int


def split(fixed: list[int], options: list[list[Option]], budget: int) -> Split:
    """The options, one per piece, of least total seconds that fit ``budget`` bytes (the module's
    inequality).

    Args:
        fixed: per piece, the bytes held beside it that no schedule changes.
        options: per piece, its schedules (`Option`).
        budget: bytes.

    Raises:
        ValueError: ``fixed`` and ``options`` differ in length.
    """
    if len(fixed) != len(options):
        raise ValueError(f"{len(fixed)} fixed sizes for {len(options)} pieces")
    # a state: (kept so far, seconds so far, peak so far, picks)
    states: list[tuple[int, float, int, tuple[int, ...]]] = [(0, 0.0, 0, ())]
    for k, offered in enumerate(options):
        grown = [(kept + o.kept, seconds + o.seconds, max(peak, fixed[k] + kept + o.peak), picks + (i,))
                 for kept, seconds, peak, picks in states
                 for i, o in enumerate(offered) if fixed[k] + kept + o.peak <= budget]
        if not grown:
            return Split((), k, 0.0, 0)
        grown.sort(key=lambda s: (s[0], s[1]))
        states, best = [], float("inf")
        for state in grown:
            if state[1] < best:
                states.append(state)
                best = state[1]
    kept, seconds, peak, picks = min(states, key=lambda s: (s[1], s[0]))
    return Split(picks, None, seconds, peak)


__all__ = ["Option", "Split", "split"]
