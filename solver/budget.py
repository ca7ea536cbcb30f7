"""A memory budget from its text: bytes, units or a percentage of the plain peak (`parse_budget`)."""
from __future__ import annotations

import re

import numpy as np


_UNITS = {"": 1, "B": 1, "KB": 2 ** 10, "KIB": 2 ** 10, "MB": 2 ** 20, "MIB": 2 ** 20,
          "GB": 2 ** 30, "GIB": 2 ** 30, "TB": 2 ** 40, "TIB": 2 ** 40}


def parse_budget(text: str | int, eager_peak_bytes: int | None = None) -> int:
    """A budget in bytes from "6GB", "6GiB", "6000MiB", "123456" or "50%".

    "GB" means 2^30 bytes, as in MONeT's tables.  "50%" is half of ``eager_peak_bytes`` (the
    simulated plain-PyTorch peak).

    Raises:
        ValueError: unparsable text, a non-positive budget, or a percentage without a peak.
    """
    if isinstance(text, (int, np.integer)):
        value = int(text)
    else:
        s = str(text).strip().upper().replace(" ", "")
        m = re.fullmatch(r"([0-9]*\.?[0-9]+)%", s)
        if m:
            if eager_peak_bytes is None:
                raise ValueError(f"budget {text!r} is relative: the plain-PyTorch peak is needed")
            value = int(float(m.group(1)) / 100.0 * eager_peak_bytes)
        else:
            m = re.fullmatch(r"([0-9]*\.?[0-9]+)([A-Z]*)", s)
            if not m or m.group(2) not in _UNITS:
                raise ValueError(f"cannot read budget {text!r}: use bytes, 6GB (= 6 x 2^30 bytes), "
                                 "6GiB, 6000MiB or a percentage like 50%")
            value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value <= 0:
        raise ValueError(f"budget must be positive, got {text!r}")
    return value
