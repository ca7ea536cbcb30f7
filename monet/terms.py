"""Errors in the caller's terms: a Python argument (``budget=...``) or a command-line flag (``--budget``).

The library raises the same errors whether `monet.optimize` or ``monet solve`` called it, and an
error's advice names what the caller can change.  Library code writes its advice with `arg`, giving
both spellings; the command line (`monet.cli.main`) runs its command inside `cli_terms`, so there
the flags are named, and everywhere else the Python arguments.
"""
from __future__ import annotations

import contextlib
import contextvars

_TERMS: contextvars.ContextVar[str] = contextvars.ContextVar("monet_terms", default="python")


@contextlib.contextmanager
def cli_terms():
    """Inside: errors name command-line flags (`arg` returns its ``cli`` spelling)."""
    token = _TERMS.set("cli")
    try:
        yield
    finally:
        _TERMS.reset(token)


def arg(python: str, cli: str) -> str:
    """``python`` (e.g. ``'budget=218242536'``), or ``cli`` (``'--budget 218242536'``) inside `cli_terms`."""
    return cli if _TERMS.get() == "cli" else python


def in_cli() -> bool:
    """True inside `cli_terms`."""
    return _TERMS.get() == "cli"


__all__ = ["arg", "cli_terms", "in_cli"]
