"""EGT's base λ keeps float32 precision (at least) when the module is cast to a narrower dtype.

In bfloat16 λ = 1.01 was 1.0078 and the annealing values 1 + ε of 000 §7.2 (iii) were all 1,
so every scale λ^q was 1. The references here are float64 values computed by hand.
"""

import math

import pytest
import torch
from torch import nn

from graded import TransformerConfig, TransformerLM
from graded.grading import ExponentialGrading, stacked_scales
from graded.train.recipes import get_recipe
from graded.transformer.graded import gradings

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
Q = [0.0, 1.0, 10.0, 100.0]
# bfloat16 keeps 8 significant bits: one unit in the last place, relative
BF16_ULP = 2.0**-7

CASTS = {
    "bfloat16()": lambda m: m.bfloat16(),
    "to(bfloat16)": lambda m: m.to(BF16),
    "half()": lambda m: m.half(),
    "to(dtype=bfloat16, device=cpu)": lambda m: m.to(device="cpu", dtype=BF16),
}


def as_float32(x: float) -> float:
    """``x`` rounded to float32, as a Python float."""
    return float(torch.tensor(x, dtype=F32))


def by_hand(lam: float, grades: list[float]) -> torch.Tensor:
    return torch.tensor([lam**q for q in grades], dtype=F64)


@pytest.mark.parametrize("cast", list(CASTS))
def test_a_cast_to_a_narrow_dtype_keeps_lambda_and_its_powers_at_float32_precision(cast):
    # the grading inside a model: the cast reaches it through the parent, as model.bfloat16()
    model = nn.Sequential(nn.Linear(4, 4), ExponentialGrading(4, Q, base=1.01))
    CASTS[cast](model)
    grading = model[1]
    narrow = model[0].weight.dtype
    assert grading.grades.dtype == narrow  # the grades follow the cast as any parameter does
    assert grading.base.dtype == F32
    assert float(grading.base) == as_float32(1.01)  # was 1.0078125 in bfloat16
    scales = grading.scales()
    assert scales.dtype == narrow  # the scales come out in the compute dtype
    torch.testing.assert_close(scales.double(), by_hand(1.01, Q), rtol=BF16_ULP, atol=0.0)
    # float32's 1.01 is off by 1e-8, which ln λ ≈ 0.01 sees as 1e-6 relative
    torch.testing.assert_close(torch.log(grading.base).double(),
                               torch.tensor(math.log(1.01), dtype=F64), rtol=2e-6, atol=0.0)


def test_the_first_annealing_values_stay_above_one_in_a_bfloat16_grading():
    # λ_t = 1 + (λ_max − 1)·t/T of 000 §7.2 (iii) with λ_max = 2, T = 1000: 1.001, 1.002, ...
    grading = ExponentialGrading(4, Q, base=1.5).bfloat16()
    for t in (1, 2, 3):
        lam = 1.0 + (2.0 - 1.0) * t / 1000
        grading.set_base(lam)
        assert float(grading.base) == as_float32(lam)  # was 1.0: M = I whatever q
        torch.testing.assert_close(grading.scales().double(), by_hand(lam, Q), rtol=BF16_ULP,
                                   atol=0.0)


def test_the_recipe_anneals_lambda_of_a_bfloat16_model_at_float32_precision():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=16,
                            grading="exponential", grading_base=3.0, learnable_grades=True)
    model = TransformerLM(cfg).bfloat16()
    recipe = get_recipe("egt-alg7.1")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0))
    recipe.on_step(model, opt, 0, 1000)  # prepares step 1 of 1000: λ_1 = 1 + 2/1000
    for name, g in gradings(model).items():
        assert g.base.dtype == F32, name
        assert float(g.base) == as_float32(1.0 + 2.0 / 1000), name


def test_a_cast_to_float64_carries_lambda_and_a_cast_back_keeps_float32():
    grading = ExponentialGrading(2, [0.0, 1.0], base=1.01).double()
    assert grading.base.dtype == F64 and float(grading.base) == as_float32(1.01)
    grading.set_base(1.01)
    assert float(grading.base) == 1.01  # float64 now holds λ exactly as given
    grading.bfloat16()
    assert grading.base.dtype == F32 and float(grading.base) == as_float32(1.01)
    grading.float()
    assert grading.base.dtype == F32 and grading.grades.dtype == F32


def test_scales_computed_before_a_cast_are_not_returned_after_it():
    grading = ExponentialGrading(4, Q, base=1.01)
    assert grading.scales().dtype == F32  # kept: fixed grades
    grading.bfloat16()
    assert grading.scales().dtype == BF16
    torch.testing.assert_close(grading.scales().double(), by_hand(1.01, Q), rtol=BF16_ULP,
                               atol=0.0)


def test_gradings_stacked_in_bfloat16_each_use_their_own_lambda():
    # the batched computation of a model's head gradings (stacked_scales) reads each λ
    first = ExponentialGrading(4, Q, base=1.01).bfloat16()
    second = ExponentialGrading(4, Q, base=1.02).bfloat16()
    stacked = stacked_scales([first, second])
    assert stacked is not None and stacked.dtype == BF16
    torch.testing.assert_close(stacked.double(), torch.stack([by_hand(1.01, Q),
                                                              by_hand(1.02, Q)]),
                               rtol=BF16_ULP, atol=0.0)


def test_scale_of_grades_in_bfloat16_uses_the_float32_lambda():
    # the weights of the graded losses (λ^q for given q): log λ was taken of a bfloat16 λ
    grading = ExponentialGrading(4, Q, base=1.01)
    got = grading.scale_of(torch.tensor(Q, dtype=BF16))
    assert got.dtype == BF16
    torch.testing.assert_close(got.double(), by_hand(1.01, Q), rtol=BF16_ULP, atol=0.0)


@pytest.mark.parametrize("dtype, lam, grades", [
    (BF16, 2.0, [10.0, 7.0, 5.5, 12.0, 3.0]),  # 2^10 came out as 1000, 2^7 as 127
    (BF16, 3.0, [3.0, 7.0, 10.0]),  # 3^3 as 27.5
    (BF16, 1.01, [0.5, 10.0, 100.0]),
    (torch.float16, 2.0, [3.0, 0.5, 4.0]),  # 2^3 as 8.0078 (within the float16 cap, e^4.5)
    (torch.float16, 1.5, [3.0, 5.5, 6.5]),  # not 7: 1.5^7 is a float16 tie (exp's last bit)
])
def test_scale_of_in_a_narrow_dtype_is_lambda_to_the_q_rounded_once(dtype, lam, grades):
    # the float64 λ^q (by hand) rounded once to the grading's dtype, exactly
    grading = ExponentialGrading(len(grades), grades, base=lam).to(dtype)
    q = torch.tensor(grades, dtype=dtype)
    assert math.exp(grading._cap()) > max(by_hand(lam, grades))  # no clamp in these cases
    got = grading.scale_of(q)
    assert got.dtype == dtype
    assert got.tolist() == by_hand(lam, grades).to(dtype).tolist()
    # for q given in bfloat16 to a float32 grading too
    got = ExponentialGrading(len(grades), base=lam).scale_of(q)
    assert got.dtype == dtype and got.tolist() == by_hand(lam, grades).to(dtype).tolist()


def test_scale_of_keeps_the_cap_and_gives_integer_grades_a_float32_scale():
    # float16: the cap exp(½ ln 65504 − 1) ≈ 94.3 of scales() clamps 2^10, after one rounding
    grading = ExponentialGrading(2, [1.0, 10.0], base=2.0).half()
    cap = 0.5 * math.log(torch.finfo(torch.float16).max) - 1.0
    got = grading.scale_of(torch.tensor([1.0, 10.0], dtype=torch.float16))
    assert got.tolist() == [2.0, float(torch.tensor(math.exp(cap), dtype=torch.float16))]
    # integer q: ln λ was cast to the integer dtype (0), giving 1 for every grade
    got = ExponentialGrading(2, base=2.0).scale_of(torch.tensor([3, 10]))
    assert got.dtype == F32 and got.tolist() == [8.0, 1024.0]


@pytest.mark.parametrize("assign", [False, True])
def test_a_state_dict_with_a_bfloat16_lambda_loads_into_the_float32_buffer(assign):
    # saved from a bfloat16 model before λ kept its precision: keys grades and base
    old = {"grades": torch.tensor(Q, dtype=BF16), "base": torch.tensor(1.01, dtype=BF16)}
    grading = ExponentialGrading(4, base=2.0)
    assert set(grading.state_dict()) == set(old)  # the key names are unchanged
    grading.load_state_dict(old, assign=assign)
    assert grading.base.dtype == F32
    assert float(grading.base) == 1.0078125  # the value stored, now widened
    grading.set_base(1.001)  # annealing goes on at float32 precision
    assert float(grading.base) == as_float32(1.001)
