"""Errors in the caller's terms: a Python argument (``budget=...``) or a command-line flag (``--budget``).

The library raises the same errors whether `monet.optimize` or ``monet solve`` called it, and an
error's advice names what the caller can change.  Library code writes its advice with `arg`, giving
both spellings; the command line (`monet.cli.main`) runs its command inside `cli_terms`, so there
the flags are named, and everywhere else the Python arguments.
"""
from __future__ import annotations

import contextlib
import contextvars
import warnings  # noqa: F401 - MonetWarning's users import it from here

class MonetWarning(UserWarning):
    """The category of the notes monet raises itself through `warnings` (docs/guide.md, "Errors
    and warnings"): a transformers model trained with ``use_cache=False`` added; a model whose
    outputs hold no loss, so that the loss computed from them is outside the budget; a model
    that cannot be copied for timing; a timed iteration that ran out of memory.  Shown once
    each, as Python shows warnings; ``monet.optimize(..., progress=False)`` shows none during the
    call; ``warnings.filterwarnings("ignore", category=monet.MonetWarning)`` silences them."""


_TERMS: contextvars.ContextVar[str] = contextvars.ContextVar("monet_terms", default="python")


@contextlib.contextmanager
def cli_terms():
    """Inside: errors name command-line flags (`arg` returns its ``cli`` spelling)."""
    token = _TERMS.set("cli")
    try:
        yield
    finally:
        _TERMS.reset(token)


def fmt_size(nbytes) -> str:
    """Bytes for a message: in GiB from 1 GiB up (3 decimals), else in MiB (2 decimals); "-" for
    None.  Two budgets a message compares, 3.97 and 4.71 MB, read "3.79 MiB" and "4.49 MiB", not
    both "0.004 GiB"."""
    if nbytes is None:
        return "-"
    return f"{nbytes / 2**30:.3f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.2f} MiB"


def arg(python: str, cli: str) -> str:
    """``python`` (e.g. ``'budget=218242536'``), or ``cli`` (``'--budget 218242536'``) inside `cli_terms`."""
    return cli if _TERMS.get() == "cli" else python


def in_cli() -> bool:
    """True inside `cli_terms`."""
    return _TERMS.get() == "cli"


__all__ = ["arg", "cli_terms", "in_cli"]
