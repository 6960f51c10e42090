"""Argument checks shared across keras-vit.

Each check raises one `ValueError` that names the argument, the bad value and what is
allowed, so every module rejects bad input with the same wording.
"""

import math
import numbers


def check_choice(name, value, allowed):
    """Raises `ValueError` unless `value` is one of `allowed`.

    Args:
        name: what the value is, as the message names it (`"optimizer"`).
        value: the value given.
        allowed: the accepted values (a tuple, list or dict's keys).

    Example:

    >>> check_choice("decay", "linear", ("cosine", "linear"))
    >>> check_choice("decay", "step", ("cosine", "linear"))
    Traceback (most recent call last):
        ...
    ValueError: Unknown decay 'step': expected one of 'cosine', 'linear'.
    """
    if value not in allowed:
        raise ValueError(
            f"Unknown {name} {value!r}: expected one of {', '.join(map(repr, allowed))}."
        )


def check_positive_int(name, value, optional=False):
    """Returns `value` as an `int`, or raises `ValueError` unless it is an integer >= 1.

    Integral floats (`8.0`) are accepted; booleans are not.

    Args:
        name: what the value is, as the message names it (`"batch_size"`).
        value: the value given.
        optional: whether `None` is accepted (and returned).

    Returns:
        `int(value)`, or `None` for an optional `None`.

    Example:

    >>> check_positive_int("batch_size", 8.0)
    8
    >>> check_positive_int("batch_size", 0)
    Traceback (most recent call last):
        ...
    ValueError: batch_size must be a positive integer, got 0.
    >>> check_positive_int("steps", None, optional=True) is None
    True
    """
    if optional and value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value != int(value)
        or value < 1
    ):
        allowed = "None or a positive integer" if optional else "a positive integer"
        raise ValueError(f"{name} must be {allowed}, got {value!r}.")
    return int(value)


def check_non_negative_int(name, value):
    """Returns `value` as an `int`, or raises `ValueError` unless it is an integer >= 0.

    Example:

    >>> check_non_negative_int("warmup_updates", 0)
    0
    >>> check_non_negative_int("seed", -1)
    Traceback (most recent call last):
        ...
    ValueError: seed must be an integer >= 0, got -1.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}.")
    return int(value)


def check_positive_number(name, value):
    """Returns `value` as a `float`, or raises `ValueError` unless it is a number > 0.

    Example:

    >>> check_positive_number("l2", 1024)
    1024.0
    >>> check_positive_number("l2", 0)
    Traceback (most recent call last):
        ...
    ValueError: l2 must be a positive number, got 0.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}.")
    return float(value)


def check_in_range(name, value, interval, purpose="", optional=False):
    """Raises `ValueError` unless the number `value` lies in `interval`.

    NaN lies in no interval; `"[0, inf)"` takes every finite number >= 0.

    Args:
        name: what the value is, as the message names it (`"dropout"`).
        value: the value given.
        interval: the interval in mathematical notation: `"[0, 1)"` includes 0 and
            excludes 1.
        purpose: words after the interval in the message (`" to choose l2"`).
        optional: whether `None` is accepted (the message then says "or None").

    Example:

    >>> check_in_range("rate", 0.5, "[0, 1)")
    >>> check_in_range("rate", 1.0, "[0, 1)")
    Traceback (most recent call last):
        ...
    ValueError: rate must be in [0, 1), got 1.0.
    >>> check_in_range("clip_norm", float("nan"), "(0, inf)", optional=True)
    Traceback (most recent call last):
        ...
    ValueError: clip_norm must be in (0, inf) or None, got nan.
    """
    if optional:
        if value is None:
            return
        purpose = f" or None{purpose}"
    low, high = (float(bound) for bound in interval[1:-1].split(","))
    inside = (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and (low <= value if interval[0] == "[" else low < value)
        and (value <= high if interval[-1] == "]" else value < high)
    )
    if not inside:
        raise ValueError(f"{name} must be in {interval}{purpose}, got {value!r}.")
