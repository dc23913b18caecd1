"""How numbers read in every output: tables, status lines, the dashboard.

One formatter per kind of quantity, so the CLI and the dashboard never show
the same figure with two precisions.
"""

from __future__ import annotations

import math

__all__ = ["format_number", "format_value", "format_seconds", "format_resource_time"]


def format_number(value: float, digits: int = 4) -> str:
    """A metric value: ``digits`` significant digits and no exponent
    (``0.9722``, ``17.31``, ``12346``, ``0.000001848``), except beyond
    ``_PLAIN`` either way, where the digits would not fit a column.

    >>> format_number(0.972222), format_number(17.3142), format_number(12345.6), format_number(-0.0)
    ('0.9722', '17.31', '12346', '0')
    >>> format_number(1.848e-06), format_number(0.5), format_number(9.99996), format_number(float("nan"))
    ('0.000001848', '0.5', '10', 'nan')
    >>> format_number(3e-20), format_number(2.5e17)
    ('3e-20', '2.5e+17')
    """
    if not math.isfinite(value):
        return str(value)
    value += 0.0  # -0.0 reads as 0
    size = abs(value)
    if size and not 1 / _PLAIN <= size < _PLAIN:
        return f"{value:.{digits}g}"
    if size >= 10 ** (digits - 1):
        return f"{value:.0f}"
    decimals = digits - 1 - math.floor(math.log10(size)) if size else 0
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


# Numbers from 1e-15 up to 1e15 print without an exponent.
_PLAIN = 1e15


def format_value(value: object, digits: int = 4) -> str:
    """A table cell: ``-`` for nothing, numbers as :func:`format_number`, the rest as text.

    >>> format_value(None), format_value(0.1234567, 6), format_value("adam"), format_value(64)
    ('-', '0.123457', 'adam', '64')
    """
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_number(value, digits)
    return str(value)


def format_seconds(seconds: float | None) -> str:
    """A duration in seconds for a table cell: ``0.4``, ``17.3``, ``245``, ``-``.

    >>> format_seconds(17.34), format_seconds(245.1), format_seconds(None)
    ('17.3', '245', '-')
    """
    if seconds is None:
        return "-"
    return f"{seconds:.1f}" if abs(seconds) < 100 else f"{seconds:.0f}"


def format_resource_time(hours: float, resource: str = "core") -> str:
    """Core- or GPU-time in the unit that suits its size, 3 significant digits.

    >>> format_resource_time(0.0153), format_resource_time(2.5, "GPU"), format_resource_time(0.0001)
    ('55.1 core-seconds', '2.50 GPU-hours', '0.360 core-seconds')
    >>> format_resource_time(0.2), format_resource_time(0)
    ('12.0 core-minutes', '0 core-hours')
    """
    if hours == 0:
        return f"0 {resource}-hours"
    seconds = hours * 3600
    if seconds < 60:
        return f"{_three(seconds)} {resource}-seconds"
    if seconds < 3600:
        return f"{_three(seconds / 60)} {resource}-minutes"
    return f"{_three(hours)} {resource}-hours"


def _three(value: float) -> str:
    """Three significant digits, without an exponent."""
    decimals = max(0, 2 - math.floor(math.log10(abs(value)))) if value else 0
    return f"{value:.{decimals}f}"
