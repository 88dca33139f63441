"""The 004 §5.3 task generators refuse inputs that would make wrong examples silently."""

import math

import pytest
import torch

from graded.morphic.tasks.adder import VariableAdditionTask
from graded.morphic.tasks.dyck import CLOSE, D0, DPOS, FILL, OPEN, DyckDepthTask, length_split
from graded.morphic.tasks.fixed_adder import (
    FixedAdditionTask,
    NoisyCodeTransformer,
    build_fixed_adder_model,
)
from graded.morphic.tasks.modular import ModularAdditionTask


@pytest.mark.parametrize("shifts", [[1.7, 2], [True, 2], ["3", 2]])
def test_variable_addition_refuses_shifts_that_are_not_ints(shifts):
    # int() read 1.7 as the adder k = 1, True as 1 and "3" as 3
    with pytest.raises(ValueError, match=r"shifts must be ints.*not ints: \[" +
                       repr(shifts[0]).replace(".", r"\.")):
        VariableAdditionTask(11, shifts)


def test_variable_addition_make_equals_hand_written_examples():
    task = VariableAdditionTask(5, (1, 3))  # tokens: digits 0..4, ADD_1 = 5, ADD_3 = 6, "=" = 7
    ids, targets, adder = task.make(torch.tensor([4, 2]), torch.tensor([1, 0]))
    assert ids.tolist() == [[4, 6, 7], [2, 5, 7]]
    assert targets.tolist() == [[-100, -100, (4 + 3) % 5], [-100, -100, (2 + 1) % 5]]
    assert adder.tolist() == [1, 0]


@pytest.mark.parametrize("x, adder, match", [
    ([1], [-1], r"adder \(adder indices\) must lie in \[0, 2\); got range \[-1, -1\]"),
    ([1], [2], r"adder \(adder indices\) must lie in \[0, 2\); got range \[2, 2\]"),
    ([5], [0], r"x \(digits\) must lie in \[0, 5\); got range \[5, 5\]"),
    ([-1], [0], r"x \(digits\) must lie in \[0, 5\); got range \[-1, -1\]"),
])
def test_variable_addition_make_refuses_digits_and_adders_out_of_range(x, adder, match):
    # adder −1 wrapped to the last shift and wrote the digit token p − 1 as the operator;
    # x = p is the ADD_1 token read as a digit
    task = VariableAdditionTask(5, (1, 3))
    with pytest.raises(ValueError, match=match):
        task.make(torch.tensor(x), torch.tensor(adder))


def test_variable_addition_make_refuses_float_digits():
    task = VariableAdditionTask(5, (1, 3))
    with pytest.raises(ValueError, match="x must be an integer tensor"):
        task.make(torch.tensor([1.0]), torch.tensor([0]))


@pytest.mark.parametrize("triple, match", [
    ([1, -1, 0], r"every adder index must lie in \[0, 2\); got range \[-1, -1\]"),
    ([1, 0, -1], r"every modulus index must lie in \[0, 2\); got range \[-1, -1\]"),
    ([1, 2, 0], r"every adder index must lie in \[0, 2\); got range \[2, 2\]"),
])
def test_modular_addition_make_refuses_indices_out_of_range(triple, match):
    # a negative index wrapped to the last shift or modulus, and its token id was another
    # kind of token (adder −1 gave the digit token max_digit − 1)
    task = ModularAdditionTask((5, 7), (1, 2))
    with pytest.raises(ValueError, match=match):
        task.make(torch.tensor([triple]))


def test_modular_addition_make_equals_hand_written_example():
    task = ModularAdditionTask((5, 7), (1, 2))  # digits 0..6, ADD 7, 8, MOD 9, 10, "=" 11
    ids, targets, adder, modulus = task.make(torch.tensor([[6, 1, 1]]))
    assert ids.tolist() == [[6, 8, 10, 11]]
    assert targets.tolist() == [[-100, -100, -100, (6 + 2) % 7]]
    assert (adder.tolist(), modulus.tolist()) == ([1], [1])


@pytest.mark.parametrize("options, match", [
    ({"p_open": 0.9, "p_fill": 0.2}, r"p_open \+ p_fill must be at most 1"),
    ({"p_open": -0.5}, r"p_open must be a probability in \[0, 1\], got -0\.5"),
    ({"p_open": math.nan}, r"p_open must be a probability in \[0, 1\], got nan"),
    ({"p_fill": 1.5}, r"p_fill must be a probability in \[0, 1\], got 1\.5"),
    ({"length": 2.5}, r"length must be an int >= 2, got 2\.5"),
    ({"length": "16"}, r"length must be an int >= 2, got '16'"),
])
def test_dyck_task_refuses_probabilities_and_lengths_that_are_not_valid(options, match):
    # p_open + p_fill = 1.1 drew no ")" at all, NaN drew no "(" but the forced ones, both
    # silently; a float or str length failed inside torch or the comparison
    with pytest.raises(ValueError, match=match):
        DyckDepthTask(**options)
    if "length" not in options:  # length_split passes them on and refuses them too
        with pytest.raises(ValueError, match=match):
            length_split(8, 16, **options)


def test_dyck_task_token_frequencies_follow_the_probabilities():
    # at p_open + p_fill = 1 no ")" is drawn; the walk only goes up, depth = number of "("
    ids, targets = DyckDepthTask(64, p_open=0.5, p_fill=0.5).sample(
        256, torch.Generator().manual_seed(0))
    assert not bool((ids == CLOSE).any())
    fill = float((ids == FILL).float().mean())
    assert abs(fill - 0.5) < 0.016  # 16384 draws: 4 standard deviations
    depth = (ids == OPEN).long().cumsum(1)
    assert torch.equal(targets, torch.where(depth > 0, DPOS, D0))


@pytest.mark.parametrize("noise", [math.inf, -1.0, math.nan])
def test_noisy_code_model_refuses_noise_that_is_not_finite_and_nonnegative(noise):
    # input_noise = inf was taken and made every training state inf (its loss NaN)
    model = build_fixed_adder_model(FixedAdditionTask(5, 2))
    with pytest.raises(ValueError, match=f"input_noise must be a finite float >= 0, got {noise}"):
        NoisyCodeTransformer(model.space, list(model.layers), 5, input_noise=noise)


@pytest.mark.parametrize("n_held_out", [True, 1.0, 0, 10])
def test_variable_addition_split_refuses_a_count_that_is_not_an_int_in_range(n_held_out):
    # True was read as 1 held-out pair
    with pytest.raises(ValueError, match=rf"n_held_out must be an int in \[1, 9\], got "
                                         rf"{n_held_out!r}"):
        VariableAdditionTask(5, (1, 2)).split(n_held_out)
