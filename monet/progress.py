"""Progress of `monet.optimize`: one tqdm bar over its phases, the solver's lines above it.

The phases are capture, costs, solve, calibration (only where schedules are timed:
`monet.profiling.calibration`) and measure (the compiled step's peak: `monet.held`); the bar's postfix keeps each finished phase's elapsed seconds, so
the last line left on stderr says where the call spent its time.  Messages (the solver's
incumbents, the calibration's readings, warnings in words) are written above the bar with
``tqdm.write``.  Disabled, it prints nothing at all.
"""
from __future__ import annotations

import contextlib
import sys
import time

PHASES = ("capture", "costs", "solve", "calibration", "measure")


class Progress:
    """The phases of one `monet.optimize` call on stderr.

    Args:
        enabled: False: print nothing (`log` and `phase` still run their blocks).
        phases: the names shown as the bar's steps, in order.
    """

    def __init__(self, enabled: bool = True, phases: tuple[str, ...] = PHASES):
        self.enabled = bool(enabled)
        self.phases = tuple(phases)
        self.elapsed: dict[str, float] = {}
        self._bar = None
        self._skipped: set[str] = set()
        if self.enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=len(self.phases), desc="monet", file=sys.stderr, leave=True, dynamic_ncols=True,
                             mininterval=1.0, bar_format="{desc} |{bar:12}| {n_fmt}/{total_fmt}{postfix}")

    def log(self, message: str) -> None:
        """Write ``monet: message`` above the bar (nothing when disabled)."""
        if not self.enabled:
            return
        from tqdm.auto import tqdm

        tqdm.write(f"monet: {message}", file=sys.stderr)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Run a block as phase ``name``: the bar shows it running, then its elapsed seconds (a
        phase run again, as `monet.lm_choice` captures a second graph, adds its seconds and is
        counted once)."""
        if self._bar is not None:
            self._bar.set_description(f"monet {name}", refresh=False)
            self._bar.set_postfix_str(self._summary(running=name))
        first = name not in self.elapsed
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.elapsed[name] = self.elapsed.get(name, 0.0) + time.perf_counter() - t0
            if self._bar is not None:
                self._bar.set_postfix_str(self._summary(), refresh=False)
                if name in self.phases and first:
                    self._bar.update(1)

    def skip(self, name: str) -> None:
        """Mark phase ``name`` as not run (it does not apply)."""
        if self._bar is not None and name in self.phases and name not in self.elapsed and name not in self._skipped:
            self._skipped.add(name)
            self._bar.update(1)

    def _summary(self, running: str | None = None) -> str:
        parts = [f"{k} {v:.1f} s" for k, v in self.elapsed.items()]
        return ", ".join(parts + ([f"{running} ..."] if running else []))

    def close(self) -> None:
        """Finish the bar (its last state stays on stderr)."""
        if self._bar is not None:
            self._bar.set_description("monet done", refresh=False)
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["PHASES", "Progress"]
