"""Diagnostics of half-precision models, and arguments that torch would take or refuse
without naming them."""

from __future__ import annotations

import math

import pytest
import torch
from analysis_helpers import tiny_config

from graded import TransformerLM
from graded.analysis import (
    attention_maps,
    head_diversity,
    model_lipschitz,
    pairwise_head_js,
    random_rank_study,
    ungraded_twin,
)


def _js_loop(p: list[float], r: list[float]) -> float:
    m = [(a + b) / 2 for a, b in zip(p, r)]
    kl = lambda x, y: sum(a * math.log(a / b) for a, b in zip(x, y) if a > 0)  # noqa: E731
    return 0.5 * kl(p, m) + 0.5 * kl(r, m)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_js_of_half_precision_softmax_rows_equals_a_float64_loop(dtype):
    """A float16 softmax row sums to 1 within float16's rounding (~1e-3): the rows were cast
    to float64 first and then held to float64's 1e-4, so every half-precision model's head
    diversity (and diagnose) failed with 'must be distributions'."""
    g = torch.Generator().manual_seed(3)
    w = torch.softmax(torch.randn(2, 3, 4, 6, generator=g) * 3, dim=-1).to(dtype)
    got = pairwise_head_js(w)
    for h in range(3):
        for h2 in range(3):
            want = sum(_js_loop(w[b, h, i].double().tolist(), w[b, h2, i].double().tolist())
                       for b in range(2) for i in range(4)) / 8
            assert got[h, h2].item() == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_diversity_of_a_half_precision_model_is_that_of_its_own_maps(dtype):
    torch.manual_seed(0)
    model = TransformerLM(tiny_config(grading="exponential", grade_init="warm_start",
                                      grade_init_value=0.2)).to(dtype)
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(1))
    maps = attention_maps(model, ids)
    result = head_diversity(model, ids)
    assert list(result) == list(maps)
    for key, w in maps.items():
        assert w.dtype == dtype
        js = result[key]["js_matrix"]
        want = sum(_js_loop(w[b, 0, i].double().tolist(), w[b, 1, i].double().tolist())
                   for b in range(2) for i in range(5)) / 10
        assert js[0, 1].item() == pytest.approx(want, abs=1e-12)
        assert result[key]["mean_js"] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("seed", ["0", 1.5, True])
def test_model_lipschitz_names_a_seed_that_is_not_an_int(seed):
    model = TransformerLM(tiny_config())
    ids = torch.randint(0, 11, (1, 3))
    with pytest.raises(TypeError, match=rf"seed must be an int, got {seed!r}"):
        model_lipschitz(model, ids, seed=seed, n_random=1, steps=0)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"n": 2.5}, TypeError, r"n must be an int, got 2\.5"),
    ({"trials": "3"}, TypeError, r"trials must be an int, got '3'"),
    ({"seed": 0.5}, TypeError, r"seed must be an int, got 0\.5"),
    ({"q_max": float("nan")}, ValueError, r"q_max must be a finite number, got nan"),
    ({"bases": ()}, ValueError, r"bases must hold at least one base λ"),
    ({"bases": (1.0, -2.0)}, ValueError, r"bases\[1\] must be > 0, got -2\.0"),
])
def test_random_rank_study_names_a_bad_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        random_rank_study(**{"n": 4, "d_k": 2, "trials": 1, **kwargs})


def test_the_twin_of_a_model_on_the_meta_device_is_refused_by_name():
    with torch.device("meta"):
        model = TransformerLM(tiny_config(grading="exponential"))
    with pytest.raises(ValueError, match=r"'decoder\.embed\.tokens\.weight' is on the meta "
                                         r"device"):
        ungraded_twin(model)
