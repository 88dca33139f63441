"""Gradings: the grade conversions and checks no other test reaches, the module reprs, and
ExponentialGrading.scales_at against λ^{s·q} computed directly."""

import numpy as np
import pytest
import torch

from graded.algebra import GradedSpace
from graded.grading import ExponentialGrading, LinearGrading, as_grade_tensor, stacked_scales


def test_integer_grade_tensors_become_floating():
    t = as_grade_tensor(torch.tensor([1, 2, 3]), dim=3)
    assert t.dtype == torch.get_default_dtype() and t.tolist() == [1.0, 2.0, 3.0]
    assert as_grade_tensor(torch.tensor([1, 2], dtype=torch.int32), dtype=torch.float64).dtype \
        == torch.float64


def test_grade_conversions_name_the_bad_value():
    with pytest.raises(TypeError, match=r"grades must be real numbers, got the bool True at "
                                        r"index 0 \(dtype torch.bool\): a bool is not a grade"):
        as_grade_tensor(torch.tensor([True, False]))
    with pytest.raises(TypeError, match=r"q must be a real tensor, got dtype torch.complex64"):
        as_grade_tensor(torch.zeros(2, dtype=torch.complex64), name="q")
    with pytest.raises(ValueError, match=r"a scalar grades=2.0 needs dim to fix its length"):
        as_grade_tensor(2.0)
    with pytest.raises(TypeError, match=r"grades must be a tensor or a sequence of numbers, got "
                                        r"\['a', 'b'\]"):
        as_grade_tensor(["a", "b"])


def test_no_gradings_have_no_stacked_scales():
    assert stacked_scales([]) is None


def test_constructor_checks_name_the_value():
    with pytest.raises(ValueError, match=r"num_heads must be a positive int or None, got 0"):
        LinearGrading(3, num_heads=0)
    with pytest.raises(ValueError, match=r"floor must be a positive finite number, got 0"):
        LinearGrading(3, floor=0)
    with pytest.raises(ValueError, match=r"max_log_scale must be a positive finite number, got "
                                         r"inf"):
        ExponentialGrading(3, max_log_scale=float("inf"))
    with pytest.raises(TypeError, match=r"base must be a real number, got 'two'"):
        ExponentialGrading(3, base="two")


def test_set_grades_keeps_the_shape():
    g = LinearGrading(3, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"new grades have shape \(2, 3\), expected \(3,\)"):
        g.set_grades(torch.zeros(2, 3))
    g.set_grades([2.0, 1.0, 0.0])
    torch.testing.assert_close(g.scales(), torch.tensor([3.0, 2.0, 1.0]))  # f = q + 1


def test_reprs_show_the_settings():
    assert "dim=3, grades_shape=(3,), learnable=False, f='shift'" in repr(LinearGrading(3))
    assert "dim=2, grades_shape=(2, 2), learnable=True, base=1.5" in repr(
        ExponentialGrading(2, base=1.5, learnable=True, num_heads=2))


def test_exponential_scales_at_multipliers_are_base_to_the_scaled_grades():
    q = [0.0, 1.0, 2.5]
    g = ExponentialGrading(3, q, base=2.0, dtype=torch.float64)
    torch.testing.assert_close(g.scales_at(None), g.scales())
    s = torch.tensor([[0.0, 1.0], [2.0, 0.5]], dtype=torch.float64)
    expected = torch.tensor([[[2.0 ** (si * qi) for qi in q] for si in row] for row in s.tolist()],
                            dtype=torch.float64)
    torch.testing.assert_close(g.scales_at(s), expected)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_scalar_grade_that_is_not_finite_is_refused_naming_it(value):
    # a list or tensor of grades was checked for finiteness, one number for every feature was
    # not: LinearGrading(3, nan) had NaN scales
    for make in (lambda: LinearGrading(3, value), lambda: LinearGrading.constant(3, value),
                 lambda: ExponentialGrading(3, value, num_heads=2),
                 lambda: ExponentialGrading.constant(3, value, learnable=True)):
        with pytest.raises(ValueError, match=rf"grades .* must be a finite number, got "
                                             rf"{value}"):
            make()


def test_learnable_floor_and_head_count_must_be_what_they_say():
    # floor=inf made every learnable shift scale inf; True was taken as one head and as floor 1
    for floor in (float("inf"), float("nan"), True):
        with pytest.raises(ValueError, match=rf"floor must be a positive finite number, got "
                                             rf"{floor}"):
            LinearGrading(3, f="shift", learnable=True, floor=floor)
    with pytest.raises(ValueError, match=r"num_heads must be a positive int or None, got True"):
        LinearGrading(3, [[0.0, 1.0, 2.0]], num_heads=True)


def test_warm_start_names_a_bad_step_or_offset():
    # c = inf gave grades (nan, inf, ...) and an error about a NaN at index 0
    with pytest.raises(ValueError, match=r"c \(the grade step of the warm start\) must be a "
                                         r"finite number, got inf"):
        LinearGrading.warm_start(4, float("inf"))
    with pytest.raises(TypeError, match=r"offset must be an int, got 0.5"):
        LinearGrading.warm_start(4, 1.0, offset=0.5)
    g = ExponentialGrading.warm_start(4, 0.5, offset=1, num_heads=2, dtype=torch.float64)
    torch.testing.assert_close(g.grades, torch.tensor([[0.5, 1.0, 1.5, 2.0]] * 2,
                                                      dtype=torch.float64))


def test_a_softplus_scale_that_underflows_is_named_as_such_not_as_q_above_minus_one():
    # softplus(q) > 0 for every real q; it is 0 only where log(1 + e^q) underflows (q = -200
    # in float32), and q = -50 is accepted: the message said "needs q > -1"
    assert torch.nn.functional.softplus(torch.tensor(-200.0)) == 0.0
    assert LinearGrading(2, [-50.0, 0.0], f="softplus").scales()[0] > 0
    with pytest.raises(ValueError, match=r"f='softplus' needs q for which softplus\(q\) does not "
                                         r"underflow to 0 in torch.float32 .*; got grades -200.0"):
        LinearGrading(2, [-200.0, 0.0], f="softplus", dtype=torch.float32)


@pytest.mark.parametrize(("grading", "learnable", "positional"), [
    ("linear", True, "sinusoidal"), ("linear", False, "rope"), ("exponential", True, "alibi"),
    ("exponential", False, "sinusoidal"), (None, False, "rope")])
def test_a_graded_lm_built_on_meta_loads_a_cpu_twin_and_computes_as_it(grading, learnable,
                                                                      positional):
    """Building on the "meta" device (no values: the usual start of loading large models) used
    to fail in the gradings' value checks (``Tensor.item()`` on meta), and ``to_empty`` left
    the positional tables, which no state dict holds, uninitialised; the values are checked
    when they exist, the tables computed again, and the materialised model computes what its
    twin does."""
    from graded import TransformerConfig, TransformerLM

    cfg = TransformerConfig(vocab_size=23, d_model=16, n_heads=2, n_layers=2, max_len=16,
                            grading=grading, learnable_grades=learnable, positional=positional,
                            **({} if grading is None else
                               {"grade_init": "warm_start", "grade_init_value": 0.3}))
    torch.manual_seed(0)
    twin = TransformerLM(cfg).eval()
    with torch.device("meta"):
        lm = TransformerLM(cfg)
    assert all(p.device.type == "meta" for p in lm.parameters())
    lm = lm.to_empty(device="cpu")
    lm.load_state_dict(twin.state_dict())
    ids = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(1))
    assert torch.equal(lm.eval()(ids), twin(ids))


def test_loaded_grades_are_checked_as_set_grades_checks_them_before_they_replace_any():
    """A state dict (a damaged or hand-edited checkpoint) with grades the grading refuses
    was loaded silently: fixed LGT grades whose scales are not positive, non-finite grades."""
    g = LinearGrading(4, [0.5, 1.0, 1.5, 2.0], f="identity")
    before = g.grades.clone()
    with pytest.raises(ValueError, match=r"f='identity' needs q > 0 .* -0\.5 at index 2"):
        g.load_state_dict({"grades": torch.tensor([0.5, 1.0, -0.5, 2.0])})
    with pytest.raises(ValueError, match=r"loaded grades must be finite, got nan at index 1"):
        g.load_state_dict({"grades": torch.tensor([0.5, float("nan"), 1.0, 2.0])})
    assert torch.equal(g.grades, before)  # nothing replaced
    e = ExponentialGrading(3, [0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"grades q >= 0 .* -1\.0 at index 0"):
        e.load_state_dict({"grades": torch.tensor([-1.0, 1.0, 2.0]), "base": e.base})
    g.load_state_dict({"grades": torch.tensor([1.0, 2.0, 3.0, 4.0])})  # good grades load
    assert g.grades.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_integer_grade_tensors_of_any_width_become_floating():
    # int16/uint8 grades were refused as "not a real tensor" (only int32/int64 passed)
    for dtype in (torch.int16, torch.uint8, torch.int8):
        t = as_grade_tensor(torch.tensor([1, 2], dtype=dtype), dim=2)
        assert t.is_floating_point() and t.tolist() == [1.0, 2.0]


def test_a_grading_refuses_a_zero_dimensional_input_naming_its_shape():
    # x.shape[-1] of a 0-d tensor raised IndexError "tuple index out of range"
    with pytest.raises(ValueError, match=r"input has shape \(\): its last dimension must hold "
                                         r"the dim=1 features"):
        ExponentialGrading(1, [1.0])(torch.tensor(2.0))


@pytest.mark.parametrize("grades, shown", [
    ([True, False], r"the bool True at index 0"),
    ([0.5, False], r"the bool False at index 1"),
    ([[1.0, 2.0], [1, True]], r"the bool True at index \(1, 1\)"),
    ([1.0, np.bool_(True)], r"the bool True at index 1"),
    (np.array([False, True]), r"the bool False at index 0 \(dtype bool\)"),
    (torch.tensor([[False, True]]), r"the bool False at index \(0, 0\) \(dtype torch.bool\)"),
    (torch.zeros(0, dtype=torch.bool), r"a tensor of dtype torch.bool and shape \(0,\)"),
])
def test_bool_grades_are_refused_by_value_in_a_list_as_in_a_tensor(grades, shown):
    # torch.tensor reads True as 1.0; GradedSpace refuses a bool grade, and so does this
    with pytest.raises(TypeError, match=r"grades must be real numbers, got " + shown
                       + r": a bool is not a grade"):
        as_grade_tensor(grades)
    flat = grades.tolist() if hasattr(grades, "tolist") else grades
    if len(flat) and not isinstance(flat[0], list):  # GradedSpace takes one row of grades
        with pytest.raises(TypeError, match=r"grade \S+ at index \d is not a real number"):
            GradedSpace(flat)


def test_integer_and_float_grades_still_convert_beside_the_bool_check():
    assert as_grade_tensor([1, 2.5]).tolist() == [1.0, 2.5]
    assert as_grade_tensor(np.array([1, 3])).tolist() == [1.0, 3.0]
    assert as_grade_tensor(torch.tensor([[1, 2]], dtype=torch.int16)).tolist() == [[1.0, 2.0]]
