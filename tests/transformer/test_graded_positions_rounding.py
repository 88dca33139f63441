"""GradedPositions (000 Def 5.21, §6; 001 §4): the factors (1 − α t) and λ^(−α t) are the
float64 values rounded once to the dtype asked for, and kept between calls only while α and
λ are what they were computed with.

Computed in float32 as exp(−α t ln λ), λ = 2, α = 1, t = 100 gave 7.8885926e-31 for
2^-100 = 7.8886091e-31 (35 float32 spacings off); ``start=True`` and ``max_len=True`` were
taken as 1."""

import copy
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graded.checks import checked_inputs
from graded.grading import ExponentialGrading
from graded.transformer.graded import GradedPositions

F64 = torch.float64
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _rounded_once(values: list[float], dtype: torch.dtype) -> torch.Tensor:
    """Python floats (float64, computed with ``math``) rounded once to ``dtype``."""
    return torch.tensor(values, dtype=F64).to(dtype)


def _egt_reference(lam: float, alpha: float, ts, dtype: torch.dtype) -> torch.Tensor:
    return _rounded_once([math.pow(lam, -alpha * t) for t in ts], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("lam", "alpha", "start"), [(2.0, 1.0, 0), (1.37, 0.3, 0),
                                                      (1.01, 0.5, 1), (3.0, 0.05, 1)])
def test_egt_factors_are_the_power_rounded_once(dtype, lam, alpha, start):
    feature = ExponentialGrading(4, base=lam)
    held = float(feature.base)  # λ as the grading holds it (float32): the factors use it
    pos = GradedPositions("exponential", alpha, 128, feature, start=start)
    t = torch.arange(128)
    want = _egt_reference(held, alpha, [i + start for i in range(128)], dtype)
    got = pos.factors(t, dtype)
    assert got.dtype == dtype
    if dtype == F64:  # torch's float64 pow and libm's may differ in the last bit
        torch.testing.assert_close(got, want, rtol=4.5e-16, atol=0)
    else:
        assert torch.equal(got, want)
    # float positions (not kept: computed for the positions given) agree exactly
    assert torch.equal(pos.factors(t.to(F64), dtype), got)


def test_egt_factor_at_t_100_is_two_to_the_minus_100_in_float32():
    pos = GradedPositions("exponential", 1.0, 128, ExponentialGrading(4, base=2.0))
    got = pos.factors(torch.tensor([100]), torch.float32)
    assert got.item() == 2.0 ** -100  # 7.8886091e-31; was 7.8885926e-31


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("alpha", "max_len", "start"), [(0.0009, 1100, 0), (0.003, 300, 1),
                                                         (0.0123, 64, 0)])
def test_lgt_factors_are_one_minus_alpha_t_rounded_once(dtype, alpha, max_len, start):
    pos = GradedPositions("linear", alpha, max_len, start=start)
    t = torch.arange(max_len)
    want = _rounded_once([1.0 - alpha * (i + start) for i in range(max_len)], dtype)
    assert torch.equal(pos.factors(t, dtype), want)
    assert torch.equal(pos.factors(t.to(torch.int32), dtype), want)


def test_kept_factors_follow_set_base_load_state_dict_and_alpha():
    feature = ExponentialGrading(4, base=1.5)
    pos = GradedPositions("exponential", 0.4, 32, feature)
    t = torch.arange(32).reshape(2, 16)
    ts = t.flatten().tolist()

    def want():
        return _egt_reference(float(feature.base), pos.alpha, ts, torch.float32).reshape(2, 16)

    assert torch.equal(pos.factors(t, torch.float32), want())
    feature.set_base(1.9)  # λ annealing, in place
    assert torch.equal(pos.factors(t, torch.float32), want())
    feature.load_state_dict({**feature.state_dict(), "base": torch.tensor(1.25)})
    assert float(feature.base) == 1.25
    assert torch.equal(pos.factors(t, torch.float32), want())
    pos.alpha = 0.7  # an annealed α
    assert torch.equal(pos.factors(t, torch.float32), want())
    feature.base = torch.tensor(1.1)  # a new tensor
    assert torch.equal(pos.factors(t, torch.float32), want())
    # a factor changed in place by its receiver (a 0-d position takes a view of the table)
    one = pos.factors(torch.tensor(5), torch.float32)
    one.mul_(0.0)
    assert torch.equal(pos.factors(t, torch.float32), want())
    # a copy computes its own (the kept tables are not copied)
    twin = copy.deepcopy(pos)
    assert twin.__dict__.get("_tables") is None
    assert torch.equal(twin.factors(t, torch.float32), want())


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def test_kept_factors_cost_one_index_per_call_inside_a_model():
    feature = ExponentialGrading(4, base=2.0)
    pos = GradedPositions("exponential", 0.25, 64, feature)
    t = torch.arange(64).expand(3, 64)
    pos.factors(t, torch.float32)  # the table is made once
    with checked_inputs(), _Ops() as mode:
        pos.factors(t, torch.float32)
    assert mode.ops == ["aten.index"]
    feature.set_base(3.0)  # the table is made again, once
    with checked_inputs(), _Ops() as mode:
        pos.factors(t, torch.float32)
    assert "aten.pow" in mode.ops
    with checked_inputs(), _Ops() as mode:
        pos.factors(t, torch.float32)
    assert mode.ops == ["aten.index"]


def test_factors_are_the_same_where_nothing_is_kept():
    feature = ExponentialGrading(4, base=1.3)
    pos = GradedPositions("exponential", 0.6, 40, feature, start=1)
    t = torch.arange(40)
    kept = pos.factors(t, torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(pos.factors(t, torch.bfloat16), kept)
    # a float position taking a gradient: d/dt λ^(−α t) = −α ln λ · λ^(−α t)
    tf = torch.tensor([3.0, 7.5], dtype=F64, requires_grad=True)
    f = pos.factors(tf, F64)
    (df,) = torch.autograd.grad(f.sum(), tf)
    lam = float(feature.base)
    for ti, d in zip([3.0, 7.5], df.tolist()):
        assert math.isclose(d, -0.6 * math.log(lam) * math.pow(lam, -0.6 * (ti + 1)),
                            rel_tol=1e-12)


def test_positions_beyond_the_table_are_refused():
    pos = GradedPositions("linear", 0.01, 16)
    with pytest.raises(ValueError, match=r"GradedPositions: position 16 is beyond max_len=16"):
        pos.factors(torch.tensor([3, 16]), torch.float32)
    with pytest.raises(ValueError, match=r"non-negative"):
        pos.factors(torch.tensor([-1, 3]), torch.float32)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"start": True}, TypeError, r"start \(the first position\) must be an int"),
    ({"start": 1.0}, TypeError, r"start \(the first position\) must be an int"),
    ({"start": 2}, ValueError, r"start must be 0 or 1"),
    ({"max_len": True}, TypeError, r"max_len must be an int"),
    ({"max_len": 16.0}, TypeError, r"max_len must be an int"),
    ({"max_len": 0}, ValueError, r"max_len must be >= 1"),
    ({"kind": "egt"}, ValueError, r"kind must be one of \('linear', 'exponential'\)"),
    ({"kind": "exponential", "base_source": None}, ValueError, r"need base_source"),
])
def test_bad_options_are_refused(options, error, message):
    args = {"kind": "linear", "alpha": 0.01, "max_len": 16, "base_source": None, **options}
    kind, alpha, max_len, base = (args.pop(k) for k in ("kind", "alpha", "max_len",
                                                        "base_source"))
    with pytest.raises(error, match=message):
        GradedPositions(kind, alpha, max_len, base, **args)
