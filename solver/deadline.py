"""One wall-clock deadline shared by the solvers of a solve (`solver.portfolio`, the peers).

A `Deadline` is created from a time limit in seconds and measured with `time.perf_counter`.  The
portfolio creates one per solve and gives each step a `Deadline.child` of the seconds its policy
row (`solver.portfolio.POLICY`) allots; a peer reads ``deadline.left()`` for its own limit.
"""
from __future__ import annotations

import time


class Deadline:
    """A point in wall-clock time (`time.perf_counter` seconds), ``seconds`` from its creation.

    Args:
        seconds: the time limit, >= 0.

    Raises:
        ValueError: a negative or non-finite limit.
    """

    def __init__(self, seconds: float):
        seconds = float(seconds)
        if not seconds >= 0 or seconds == float("inf"):
            raise ValueError(f"a deadline needs a finite time limit >= 0 seconds, got {seconds!r}")
        self.limit_s = seconds
        self.start = time.perf_counter()
        self.end = self.start + seconds

    def left(self) -> float:
        """Seconds until the deadline, 0 once it has passed."""
        return max(0.0, self.end - time.perf_counter())

    def until(self, margin_s: float = 0.0) -> float:
        """Seconds until ``margin_s`` seconds before the deadline; negative once that has passed
        (the portfolio's shares floor it themselves)."""
        return self.end - margin_s - time.perf_counter()

    def expired(self) -> bool:
        """True once the deadline has passed."""
        return time.perf_counter() >= self.end

    def elapsed(self) -> float:
        """Seconds since the deadline was created."""
        return time.perf_counter() - self.start

    def share(self, fraction: float) -> float:
        """``fraction`` (0 to 1) of the seconds left.

        Raises:
            ValueError: a fraction outside [0, 1]."""
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"a share of the time left is a fraction in [0, 1], got {fraction!r}")
        return fraction * self.left()

    def child(self, seconds: float) -> "Deadline":
        """A deadline ``seconds`` from now, for one step of a solve.  It is not clipped to this
        one: the portfolio floors each step's share (at least 1 s, `solver.portfolio.POLICY`),
        so a step may end after the limit, as `solver.portfolio.solve_full` documents."""
        return Deadline(max(0.0, seconds))

    def __repr__(self) -> str:
        return f"Deadline({self.limit_s:g} s, {self.left():.3f} s left)"
