"""LR schedules: the checks no other test reaches, and make_scheduler's inverse_sqrt against
002 Eq. (6.6) computed by hand."""

import math

import pytest
import torch

from graded.train.schedules import constant, make_scheduler, warmup_cosine


@pytest.mark.parametrize("warmup", [-1, 2.5])
def test_warmup_must_be_a_non_negative_int(warmup):
    with pytest.raises(ValueError, match=rf"warmup_steps must be a non-negative int, got {warmup}"):
        constant(warmup)


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_cosine_min_ratio_must_lie_in_the_unit_interval(ratio):
    with pytest.raises(ValueError, match=rf"min_ratio must be in \[0, 1\], got {ratio}"):
        warmup_cosine(2, 10, ratio)


def _opt():
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)


def test_the_cosine_schedule_needs_total_steps():
    with pytest.raises(ValueError, match=r"the cosine schedule needs total_steps"):
        make_scheduler(_opt(), "cosine", warmup_steps=2)


def test_make_scheduler_inverse_sqrt_follows_vaswani():
    d_model, warmup = 16, 4
    opt = _opt()
    sched = make_scheduler(opt, "inverse_sqrt", warmup_steps=warmup, d_model=d_model)
    for step in range(10):
        s = step + 1  # 002 Eq. (6.6) counts steps from 1
        expected = d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)
        assert math.isclose(opt.param_groups[0]["lr"], expected, rel_tol=1e-12)
        opt.step()
        sched.step()


@pytest.mark.parametrize(("total", "error"), [(math.nan, TypeError), (10.5, TypeError),
                                              (True, TypeError)])
def test_cosine_total_steps_must_be_an_int(total, error):
    # total_steps = nan passed the check (nan <= warmup is false) and gave learning rates
    # (0.5, 1.0, nan, nan, ...); True was one step
    with pytest.raises(error, match=rf"total_steps must be an int, got {total}"):
        warmup_cosine(2, total)


def test_a_bool_warmup_is_refused():
    with pytest.raises(ValueError, match=r"warmup_steps must be a non-negative int, got True"):
        constant(True)


def test_cosine_values_against_the_formula():
    # warmup (s + 1)/w for s < w, then r + (1 − r)·(1 + cos(π (s − w)/(T − w)))/2
    w, total, r = 2, 10, 0.1
    fn = warmup_cosine(w, total, r)
    for s in range(14):
        expected = ((s + 1) / w if s < w else
                    r + (1 - r) * (1 + math.cos(math.pi * min(s - w, total - w) / (total - w))) / 2)
        assert math.isclose(fn(s), expected, rel_tol=1e-12)


@pytest.mark.parametrize(("name", "option", "message"), [
    ("constant", {"min_ratio": 0.1}, r"min_ratio=0\.1 is the floor of the cosine schedule; "
                                     r"schedule 'constant' has none"),
    ("inverse_sqrt", {"min_ratio": 0.5}, r"min_ratio=0\.5 .* schedule 'inverse_sqrt' has none"),
    ("constant", {"d_model": 64}, r"d_model=64 scales the inverse_sqrt schedule .* "
                                  r"schedule 'constant' does not read it"),
    ("cosine", {"d_model": 64}, r"schedule 'cosine' does not read it")])
def test_an_option_the_schedule_does_not_read_is_refused(name, option, message):
    """make_scheduler(opt, "constant", min_ratio=0.1) gave the rate 1.0 × lr at every step."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match=message):
        make_scheduler(opt, name, warmup_steps=2, total_steps=10, **option)


@pytest.mark.parametrize("name", ["constant", "cosine", "inverse_sqrt"])
def test_the_rate_of_every_optimizer_step_is_the_hand_formula(name):
    """Step s (0-based, as the optimizer takes them) runs at lr × the formula at s, warmup
    (s + 1)/w, through and past the end of the schedule."""
    w, total, r, lr = 3, 8, 0.2, 0.5
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = make_scheduler(opt, name, warmup_steps=w, total_steps=total,
                           min_ratio=r if name == "cosine" else 0.0)

    def hand(s: int) -> float:
        if name == "inverse_sqrt":
            return min((s + 1) ** -0.5, (s + 1) * w ** -1.5) * w ** 0.5
        if s < w:
            return (s + 1) / w
        if name == "constant":
            return 1.0
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * min(s - w, total - w) / (total - w)))

    for s in range(total + 2):
        assert math.isclose(opt.param_groups[0]["lr"], lr * hand(s), rel_tol=1e-12), s
        opt.step()
        sched.step()
