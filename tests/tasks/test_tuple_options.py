"""Tuple-valued task options (``weights``, ``lambda_range``, ``bands``, ``amplitude_range``):
a value of the wrong shape or type, a non-finite or fractional entry is refused by a message
that names the option, not by a bare unpacking error or a silent truncation."""

import math

import numpy as np
import pytest

from graded.tasks import get_task


@pytest.mark.parametrize("name, option, value, pattern", [
    ("weighted_projective", "weights", 2.0, r"weights must be a sequence of numbers, got 2\.0"),
    ("weighted_projective", "weights", "2 4", r"weights must be a sequence of numbers"),
    ("weighted_projective", "weights", (2, True), r"weights\[1\] must be a number, got True"),
    ("weighted_projective", "weights", (2, math.nan), r"weights\[1\] must be a finite number"),
    ("weighted_projective_pair", "lambda_range", 1.0,
     r"lambda_range must be a sequence of numbers, got 1\.0"),
    ("weighted_projective_pair", "lambda_range", (1.0,),
     r"lambda_range must hold 2 numbers, got 1"),
    ("weighted_projective", "lambda_range", (0.5, math.inf),
     r"lambda_range\[1\] must be a finite number, got inf"),
    ("multiscale", "bands", 3, r"bands must be a sequence of \(low, high\) wavenumber pairs"),
    ("multiscale", "bands", ((1, 2), 4), r"bands\[1\] must be a sequence of numbers, got 4"),
    ("multiscale", "bands", ((1, 2, 3),), r"bands\[0\] must hold 2 numbers, got 3"),
    ("multiscale", "bands", ((1.5, 2),), r"bands\[0\]\[0\] must be an int, got 1\.5"),
    ("multiscale", "bands", ((True, 2),), r"bands\[0\]\[0\] must be an int, got True"),
    ("multiscale", "amplitude_range", 1.0, r"amplitude_range must be a sequence of numbers"),
    ("multiscale", "amplitude_range", (0.5, math.inf),
     r"amplitude_range\[1\] must be a finite number, got inf"),
])
def test_a_tuple_option_of_the_wrong_shape_type_or_value_is_refused_naming_it(
        name, option, value, pattern):
    with pytest.raises((TypeError, ValueError), match=pattern):
        get_task(name, **{option: value})


def test_an_infinite_amplitude_bound_no_longer_generates_non_finite_signals():
    # before: amplitude_range=(0, inf) was accepted and generate() returned inf/NaN inputs
    with pytest.raises(ValueError, match="amplitude_range"):
        get_task("multiscale", amplitude_range=(0.0, math.inf)).generate(4, 0)


def test_valid_tuple_options_are_kept_as_given_and_rebuild_the_task():
    task = get_task("multiscale", bands=[[1, 2], [5, 9]], amplitude_range=[1, 2])
    assert task.bands == ((1, 2), (5, 9)) and task.amplitude_range == (1.0, 2.0)
    wp = get_task("weighted_projective", weights=[1, 3], lambda_range=[0.5, 2])
    assert wp.weights == (1.0, 3.0) and wp.lambda_range == (0.5, 2.0)
    assert get_task(wp.name, **wp.config()) == wp
    arrays = get_task("multiscale", bands=np.array([[1, 2], [5, 9]]),
                      amplitude_range=np.array([1.0, 2.0]))
    assert arrays.bands == task.bands and arrays.amplitude_range == task.amplitude_range
    assert get_task("weighted_projective", weights=np.array([1, 3])).weights == (1.0, 3.0)
