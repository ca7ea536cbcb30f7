"""The short suite and the long cases, in one place.

``pytest -q`` (README.md's test command, which CI runs: ``bash .ci/run``, a fresh clone, 2 cores,
20 minutes for the install and the suite) runs the short suite: it leaves out the slowest cases
whose behaviour another test covers.  ``MONET_LONG_TESTS=1 pytest -q`` runs them all.  Every such
skip says what it leaves out, how long it takes on 2 cores and what covers it, through
`skip_unless_long` or `long_only`."""
import os

import pytest

#: ``MONET_LONG_TESTS=1``: the long cases run too
LONG = os.environ.get("MONET_LONG_TESTS", "") not in ("", "0")
#: the short suite (the default)
SHORT = not LONG


def reason(what: str, seconds: int | None = None, covered: str = "") -> str:
    """The skip message: ``what`` (``seconds`` on 2 cores) runs with MONET_LONG_TESTS=1; ``covered``."""
    took = f" ({seconds} s on 2 cores)" if seconds else ""
    return f"{what}{took} runs with MONET_LONG_TESTS=1" + (f"; {covered}" if covered else "")


def skip_unless_long(what: str, seconds: int | None = None, covered: str = "") -> None:
    """Skip the running test in the short suite (see the module), with `reason`'s message."""
    if SHORT:
        pytest.skip(reason(what, seconds, covered))


def long_only(what: str, seconds: int | None = None, covered: str = ""):
    """`skip_unless_long` as a mark, for a whole test: ``@long_only("the GPU table's CPU path", 130)``."""
    return pytest.mark.skipif(SHORT, reason=reason(what, seconds, covered))


#: the timeout of a test's child process: a guard against a hung child only, far above any run
#: (the slowest, the GPU table's CPU path, took 130 s on 2 idle cores and over 300 s beside two
#: busy processes), so that no outcome depends on the machine's speed
HANG_GUARD_S = 3600
