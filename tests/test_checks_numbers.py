"""graded.checks.check_float is the one check of a number: NaN, ±inf, booleans and values out of
range are refused with the option's name, the value and the range; the backend scale, the
morphic temperatures and steps, and the recipe options use it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graded.attention.backends.base import check_scale
from graded.checks import NotANumberError, check_float, check_int
from graded.morphic import EdgeSet, GradedStateSpace, Router
from graded.train.recipes import get_recipe


def test_real_numbers_and_0d_tensors_are_numbers_and_come_back_as_floats():
    for value in (2, 2.0, np.float32(2.0), np.int64(2), np.array(2.0), torch.tensor(2.0),
                  torch.tensor(2, dtype=torch.int64)):
        out = check_float("x", value, minimum=0, strict_min=True)
        assert out == 2.0 and type(out) is float


@pytest.mark.parametrize("value", [True, False, "1", None, [1.0], torch.tensor([1.0, 2.0]),
                                   torch.tensor(True), np.bool_(True), torch.tensor(1 + 1j),
                                   np.array([1.0])])
def test_what_is_not_a_number_is_refused_as_a_type_and_a_value_error(value):
    with pytest.raises(NotANumberError, match=r"x must be a number in \(0, 1\], got "):
        check_float("x", value, minimum=0, maximum=1, strict_min=True)
    assert issubclass(NotANumberError, TypeError) and issubclass(NotANumberError, ValueError)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, torch.tensor(math.nan)])
def test_nan_and_infinities_are_refused_naming_the_range(value):
    with pytest.raises(ValueError, match=r"^x must be a finite number, got (nan|inf|-inf) "
                                         r"\(expected >= 0\.0\)$"):
        check_float("x", value, minimum=0.0)
    with pytest.raises(ValueError, match=r"^x must be a finite number, got (nan|inf|-inf)$"):
        check_float("x", value)


def test_the_range_messages_of_existing_callers_are_kept():
    with pytest.raises(ValueError, match=r"^edge_prob must be <= 1\.0, got 1\.5$"):
        check_float("edge_prob", 1.5, minimum=0.0, maximum=1.0)
    with pytest.raises(ValueError, match=r"^norm_p must be > 0\.0, got 0\.0$"):
        check_float("norm_p", 0.0, minimum=0.0, strict_min=True)
    with pytest.raises(ValueError, match=r"^noise must be >= 0\.0, got -1$"):
        check_float("noise", -1, minimum=0.0)


def _router(temperature):
    space = GradedStateSpace([("a", 2, 0), ("b", 2, 1)])
    return Router(space, EdgeSet.explicit(space, [("a", "b")]), temperature=temperature)


CHECKS = {  # a later check of a number > 0, and the name its messages give the option
    "backend scale": (lambda v: check_scale("full", v), "full backend: scale"),
    "router temperature": (_router, "temperature"),
    "recipe clip_norm": (lambda v: get_recipe("plain", clip_norm=v), "clip_norm"),
}


@pytest.mark.parametrize("check", sorted(CHECKS))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, True, 0.0, -1.0, "1"])
def test_every_later_number_check_refuses_like_check_float_naming_option_and_range(check, bad):
    run, name = CHECKS[check]
    with pytest.raises(ValueError) as exc:
        run(bad)
    message = str(exc.value)
    assert message.startswith(name) and "> 0" in message
    assert f"got {bad!r}" in message or f"got {bad}" in message
    run(0.5)  # a positive finite number passes


def test_integer_scalars_and_0d_integer_tensors_are_ints_and_come_back_as_ints():
    for value in (3, np.int64(3), np.array(3), torch.tensor(3), torch.tensor(3, dtype=torch.int32)):
        out = check_int("n", value, minimum=1)
        assert out == 3 and type(out) is int


@pytest.mark.parametrize("value", [torch.tensor(2.5), np.array(2.7), torch.tensor(True),
                                   np.bool_(True), True, 2.0, torch.tensor([3]),
                                   np.array([3]), "3"])
def test_what_is_not_an_int_is_refused_not_truncated_or_unwrapped(value):
    # int() would read tensor(2.5) as 2, tensor(True) as 1 and tensor([3]) as 3
    with pytest.raises(TypeError, match=r"n must be an int, got "):
        check_int("n", value)
