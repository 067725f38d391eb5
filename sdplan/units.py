"""Quantities with units: parsing ``2s``, ``300ms``, ``2000tok/s``, ``12rps``.

Everything inside sdplan is in SI base units (seconds, requests per second,
tokens per second); units appear only at the edges: parsing here, formatting
in the renderers. :func:`finite_or_none` is the one rule for writing a quantity
into JSON or CSV, shared by the renderers and the benchmarks' records (which may
not import :mod:`sdplan.render`); :func:`written_number` the one for writing a
fitted number (a cost, an error) into a calibration file.
"""

from __future__ import annotations

import math
import re
from enum import Enum

from sdplan.errors import InvalidValueError


class Dimension(str, Enum):
    """What a quantity measures."""

    TIME = "time"
    TOKEN_RATE = "token rate"
    REQUEST_RATE = "request rate"
    FRACTION = "fraction"


#: unit spelling -> (dimension, factor to SI)
UNITS: dict[str, tuple[Dimension, float]] = {
    "s": (Dimension.TIME, 1.0),
    "ms": (Dimension.TIME, 1e-3),
    "us": (Dimension.TIME, 1e-6),
    "min": (Dimension.TIME, 60.0),
    "tok/s": (Dimension.TOKEN_RATE, 1.0),
    "tokens/s": (Dimension.TOKEN_RATE, 1.0),
    "rps": (Dimension.REQUEST_RATE, 1.0),
    "req/s": (Dimension.REQUEST_RATE, 1.0),
    "%": (Dimension.FRACTION, 0.01),
    "": (Dimension.FRACTION, 1.0),
}

_QUANTITY = re.compile(r"^\s*(?P<number>[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?)\s*(?P<unit>[a-zA-Z/%]*)\s*$")


def parse_quantity(text: str, expected: Dimension) -> float:
    """Parse a number with its unit into SI.

    Raises
    ------
    InvalidValueError
        If the text is not a number followed by a unit of the expected
        dimension (a bare number is only accepted for fractions).
    """
    match = _QUANTITY.match(text)
    allowed = ", ".join(repr(unit) for unit, (dim, _) in UNITS.items() if dim is expected and unit)
    if not match:
        raise InvalidValueError(f"'{text}' is not a number with a unit ({expected.value}: {allowed or 'no unit'})")
    unit = match.group("unit").lower()
    if unit not in UNITS:
        raise InvalidValueError(f"unknown unit '{match.group('unit')}' in '{text}'; use one of {allowed or 'no unit'}")
    dimension, factor = UNITS[unit]
    if dimension is not expected:
        if unit == "":
            raise InvalidValueError(f"'{text}' needs a unit ({expected.value}: {allowed})")
        raise InvalidValueError(f"'{text}' is a {dimension.value}, expected a {expected.value} ({allowed})")
    value = float(match.group("number")) * factor
    if not math.isfinite(value):
        raise InvalidValueError(f"'{text}' is not finite")
    return value


def format_seconds(seconds: float) -> str:
    """``0.0123`` -> ``12.3 ms``; ``2.5`` -> ``2.5 s``."""
    if not math.isfinite(seconds):
        return "unstable" if seconds > 0 else "-"
    if abs(seconds) < 1.0:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds:.4g} s"


def finite_or_none(value: float) -> float | None:
    """A float for JSON/CSV, ``None`` where it is not finite (unstable or undefined).

    JSON has no infinity or NaN (``json.dumps(..., allow_nan=False)`` refuses them), and an unstable
    load's latency is infinite, so such a value is written as ``null``.
    """
    number = float(value)
    return number if math.isfinite(number) else None


def written_number(value: float) -> float:
    """A fitted number (a cost, a fit error) as a calibration file writes it: six significant digits (``derive``
    and ``calibrate`` alike, so that a file is byte-reproducible from its inputs and no digit claims more than the
    fit resolves)."""
    return float(f"{value:.6g}")
