"""What CI leaves out, in one place.

CI (``bash .ci/run`` with ``CI=true``: a fresh clone, 2 cores, 20 minutes for the install and the
whole suite) skips the slowest cases whose behaviour another test covers; the README's test command
(no ``CI``) runs them all.  Every such skip says what it leaves out, how long it takes on 2 cores
and what covers it, through `skip_in_ci` or `not_in_ci`."""
import os

import pytest

IN_CI = bool(os.environ.get("CI"))


def reason(what: str, seconds: int | None = None, covered: str = "") -> str:
    """The skip message: ``what`` (``seconds`` on 2 cores) runs without CI=true; ``covered``."""
    took = f" ({seconds} s on 2 cores)" if seconds else ""
    return f"{what}{took} runs without CI=true (CI's 20-minute budget)" + (f"; {covered}" if covered else "")


def skip_in_ci(what: str, seconds: int | None = None, covered: str = "") -> None:
    """Skip the running test under CI (see the module), with `reason`'s message; nothing otherwise."""
    if IN_CI:
        pytest.skip(reason(what, seconds, covered))


def not_in_ci(what: str, seconds: int | None = None, covered: str = ""):
    """`skip_in_ci` as a mark, for a whole test: ``@not_in_ci("the GPU table's CPU path", 130)``."""
    return pytest.mark.skipif(IN_CI, reason=reason(what, seconds, covered))


#: the timeout of a test's child process: a guard against a hung child only, far above any run
#: (the slowest, the GPU table's CPU path, took 130 s on 2 idle cores and over 300 s beside two
#: busy processes), so that no outcome depends on the machine's speed
HANG_GUARD_S = 3600
