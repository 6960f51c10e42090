"""keras_vit.utils.checks: each check accepts the edge values it promises and names the bad one."""

import math
import re

import pytest

from keras_vit.utils.checks import (
    check_choice, check_in_range, check_positive_int, check_positive_number,
)


def test_choice_names_the_value_and_the_choices():
    check_choice("decay", "cosine", {"cosine": 1, "linear": 2})
    message = r"^Unknown decay 'cos': expected one of 'cosine', 'linear'\.$"
    with pytest.raises(ValueError, match=message):
        check_choice("decay", "cos", {"cosine": 1, "linear": 2})


@pytest.mark.parametrize("value", [1, 7, 3.0])
def test_positive_int_returns_an_int(value):
    result = check_positive_int("batch_size", value)
    assert result == value and type(result) is int


@pytest.mark.parametrize("value", [0, -2, 2.5, True, math.nan, math.inf, "8", None])
def test_positive_int_rejects(value):
    message = "^batch_size must be a positive integer, got " + re.escape(repr(value)) + r"\.$"
    with pytest.raises(ValueError, match=message):
        check_positive_int("batch_size", value)


def test_optional_positive_int():
    assert check_positive_int("steps", None, optional=True) is None
    with pytest.raises(ValueError, match=r"^steps must be None or a positive integer, got 0\.$"):
        check_positive_int("steps", 0, optional=True)


@pytest.mark.parametrize(
    "interval, inside, outside",
    [("[0, 1]", [0, 1, 0.5], [-1e-9, 1.0000001]), ("[0, 1)", [0, 0.999], [1, -0.1]),
     ("(0, 1]", [1e-9, 1], [0, 1.5]), ("(0, 1)", [0.5], [0, 1])],
)
def test_in_range_bounds(interval, inside, outside):
    for value in inside:
        check_in_range("x", value, interval)
    for value in outside:
        with pytest.raises(ValueError, match="^x must be in " + re.escape(interval) + ", got"):
            check_in_range("x", value, interval)


def test_in_range_rejects_non_numbers_with_the_purpose():
    for value in (math.nan, None, "0.5", True):
        with pytest.raises(ValueError, match=r"to choose l2, got"):
            check_in_range("holdout_fraction", value, "(0, 1)", " to choose l2")


@pytest.mark.parametrize("value", [0, -1.0, math.nan, True, "1", None])
def test_positive_number_rejects(value):
    message = "^l2 must be a positive number, got " + re.escape(repr(value))
    with pytest.raises(ValueError, match=message):
        check_positive_number("l2", value)
    assert check_positive_number("l2", 2**-10) == 2**-10
