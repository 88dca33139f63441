"""Training recipes (000 Alg 5.1, 7.1): annealing, the grade learning-rate bound, regularisers."""

import decimal
import math

import pytest
import torch

from graded import TransformerConfig, TransformerLM
from graded.attention.graded import GradedMultiheadAttention
from graded.train import sequence_cross_entropy
from graded.train.recipes import (
    Recipe,
    anneal_lambda,
    coordination_penalty,
    get_recipe,
    grade_lr_bound,
)
from graded.transformer.graded import gradings, head_gradings


def lm(grading, **kw):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=16,
                            grading=grading, learnable_grades=True, **kw)
    return TransformerLM(cfg)


def test_lambda_annealing_values_at_start_middle_and_end():
    assert anneal_lambda(0, 100, 3.0) == 1.0
    assert anneal_lambda(50, 100, 3.0) == pytest.approx(2.0)
    assert anneal_lambda(100, 100, 3.0) == pytest.approx(3.0)
    assert anneal_lambda(150, 100, 3.0) == pytest.approx(3.0)


def test_annealing_sets_every_exponential_grading():
    model = lm("exponential", grading_base=3.0)
    recipe = get_recipe("egt-alg7.1")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0))
    for done, expected in ((0, 1.02), (49, 2.0), (99, 3.0)):
        info = recipe.on_step(model, opt, done, 100)
        assert info["lambda"] == pytest.approx(expected)
        for g in gradings(model).values():
            assert float(g.base) == pytest.approx(expected)


def test_lr_bound_formulas():
    assert grade_lr_bound("linear", 4.0) == 0.25
    assert math.isinf(grade_lr_bound("linear", 0.0))
    assert grade_lr_bound("exponential", 2.0, 3.0) == pytest.approx(1 / (9 * math.log(3)))
    assert math.isinf(grade_lr_bound("exponential", 2.0, 1.0))


def test_regularisers_equal_hand_computation():
    model = lm("exponential", grades_per_head=True)
    feature = model.feature_grading
    (head,) = head_gradings(model)
    with torch.no_grad():
        feature.grades.copy_(torch.arange(8.0) / 4)
        head.grades.copy_(torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]]))
    recipe = get_recipe("egt-alg7.1", gamma=0.5, gamma_heads=0.25, gamma_coord=2.0)
    q = torch.arange(8.0) / 4
    heads = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    mean = heads.mean(0)
    coord = sum(((heads[i] - mean) ** 2).sum() for i in range(2))
    expected = 0.5 * (q**2).sum() + 0.25 * (heads**2).sum() + 2.0 * coord
    assert recipe.regularization(model).item() == pytest.approx(expected.item())
    assert coordination_penalty(torch.ones(4)).item() == 0.0


def test_head_penalty_finds_graded_attention_by_role_not_by_attribute_name():
    """A graded attention held as ``mixer`` (no "attn" in its name) still gets γ′‖q‖²."""
    mixer = GradedMultiheadAttention(4, 2, "exponential", learnable_grades=True,
                                     grades=[0.0, 1.0])
    model = torch.nn.ModuleDict({"mixer": mixer})
    recipe = get_recipe("egt-alg7.1", gamma=0.5, gamma_heads=0.25, gamma_coord=0.0)
    assert recipe.regularization(model).item() == pytest.approx(0.25 * 1.0)


@pytest.mark.parametrize(("grading", "recipe_name"),
                         [("linear", "lgt-alg5.1"), ("exponential", "egt-alg7.1")])
def test_grade_lr_stays_below_bound_at_every_step_while_grades_grow(grading, recipe_name):
    model = lm(grading, grade_init="warm_start", grade_init_value=0.5, grading_base=2.5)
    recipe = get_recipe(recipe_name)
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0, grade_lr=0.5))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    steps = 30
    recipe.on_step(model, opt, 0, steps)
    x = torch.randint(0, 11, (4, 6))
    q_max_seen = []
    for s in range(steps):
        gs = list(gradings(model).values())
        q_max = max(float(g.grades.detach().max()) for g in gs)
        lam = float(model.feature_grading.base) if grading == "exponential" else None
        bound = grade_lr_bound(grading, q_max, lam)
        grade_group = next(g for g in opt.param_groups if g["name"] == "grades")
        assert grade_group["lr"] < bound
        q_max_seen.append(q_max)
        # a loss that rewards larger grades, so q_max grows and the bound tightens
        loss = sequence_cross_entropy(model(x)[:, :-1], x[:, 1:])
        loss = loss - sum(g.grades.sum() for g in gs)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        recipe.on_step(model, opt, s + 1, steps)
    assert q_max_seen[-1] > q_max_seen[0] + 1.0


def test_grades_have_their_own_group_without_decay():
    model = lm("linear")
    groups = get_recipe("lgt-alg5.1").param_groups(model, lr=1e-3, weight_decay=0.1,
                                                   grade_lr=0.01)
    grade_group = next(g for g in groups if g["name"] == "grades")
    assert grade_group["lr"] == 0.01 and grade_group["weight_decay"] == 0.0
    n_grades = len([n for n, _ in model.named_parameters() if n.endswith("grades")])
    assert len(grade_group["params"]) == n_grades


def test_unknown_recipe_and_option_are_named():
    with pytest.raises(ValueError, match="unknown recipe 'alg9'"):
        get_recipe("alg9")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['gama'\]"):
        get_recipe("lgt-alg5.1", gama=1.0)


def test_an_option_the_recipe_does_not_use_is_refused_naming_it_its_value_and_its_options():
    """`graded train ... --set recipe.name=plain --set recipe.options.gamma=0.1` trained
    without a word, though the plain recipe has no grade regulariser."""
    plain = r"its options are \['clip_norm'\]"
    with pytest.raises(ValueError, match=r"recipe 'plain' does not use gamma=0\.1, .*" + plain):
        get_recipe("plain", gamma=0.1)
    with pytest.raises(ValueError, match=r"does not use gamma_heads=0\.2, lr_bound='off', "):
        get_recipe("plain", gamma_heads=0.2, lr_bound="off", clip_norm=2.0)
    with pytest.raises(ValueError, match=r"recipe 'lgt-alg5\.1' does not use anneal=False, .*"
                                         r"\['gamma', 'gamma_heads', 'gamma_coord', 'lr_margin', "
                                         r"'clip_norm', 'lr_bound', 'graded_loss'\]"):
        get_recipe("lgt-alg5.1", anneal=False)  # LGT has no λ to anneal
    with pytest.raises(ValueError, match="recipe 'plain' does not use graded_loss=False"):
        get_recipe("plain").with_options(graded_loss=False)  # the same rule as get_recipe
    assert get_recipe("plain", clip_norm=2.0).clip_norm == 2.0
    every = {"gamma": 0.5, "gamma_heads": 0.5, "gamma_coord": 0.5, "anneal": True,
             "lambda_max": 3.0, "lr_margin": 0.5, "clip_norm": 2.0, "lr_bound": "off",
             "graded_loss": False}
    assert get_recipe("egt-alg7.1", **every).options == tuple(every)  # EGT reads them all


def test_the_options_plain_does_not_read_change_nothing_it_computes():
    """What the refusal rests on: a plain recipe built (by hand, past get_recipe) with every
    option it does not read gives the same regulariser, loss weights, groups and step as
    without, on a model with learnable head and feature grades they would act on."""
    model = lm("exponential", grades_per_head=True)
    with torch.no_grad():
        for g in gradings(model).values():
            g.grades.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
    unused = {"gamma": 0.5, "gamma_heads": 0.5, "gamma_coord": 0.5, "lr_margin": 0.5,
              "lr_bound": "off", "graded_loss": False}
    base = get_recipe("plain")
    # every option but plain's own and λ's (refused on a kind other than exponential)
    assert set(unused) == every_option() - set(base.options) - {"anneal", "lambda_max"}
    other = Recipe(**unused)
    assert float(other.regularization(model).detach()) == 0.0
    assert other.loss_weights(model, torch.tensor([0.0, 1.0, 2.0])) is None
    opts = [torch.optim.SGD(r.param_groups(model, lr=0.1, weight_decay=0.0), lr=0.1)
            for r in (base, other)]
    assert [r.on_step(model, o, 0, 10) for r, o in zip((base, other), opts)] == [{}, {}]
    assert [g["lr"] for g in opts[0].param_groups] == [g["lr"] for g in opts[1].param_groups]
    # the same options on EGT do act: they are read there
    egt = get_recipe("egt-alg7.1", gamma=0.5)
    assert float(egt.regularization(model).detach()) > 0.0


def every_option() -> set[str]:
    return set(Recipe.__dataclass_fields__) - {"name", "kind"}


def test_egt_recipe_projects_grades_onto_nonnegative_values():
    model = lm("exponential")
    recipe = get_recipe("egt-alg7.1")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0))
    with torch.no_grad():
        model.feature_grading.grades.fill_(-0.5)
    recipe.on_step(model, opt, 1, 10)
    assert torch.all(model.feature_grading.grades == 0)


def test_lgt_bound_uses_the_largest_entry_of_m_not_the_largest_grade():
    # neutral "shift" grades are q = 0, so M = I: the bound 1/q_max is 1/1, not infinite
    model = lm("linear")
    recipe = get_recipe("lgt-alg5.1")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0, grade_lr=5.0))
    info = recipe.on_step(model, opt, 0, 10)
    assert info["q_max"] == pytest.approx(1.0) and info["grade_lr_bound"] == pytest.approx(1.0)
    assert info["grade_lr"] == pytest.approx(0.9 * 1.0)
    # grades 0..3 under f(q) = q + 1: M's largest entry is 4, computed here by hand
    with torch.no_grad():
        for g in gradings(model).values():
            g.grades.copy_(torch.arange(g.grades.numel(), dtype=g.grades.dtype)
                           .reshape(g.grades.shape) % 4)
    info = recipe.on_step(model, opt, 1, 10)
    assert info["q_max"] == pytest.approx(4.0)
    assert info["grade_lr"] == pytest.approx(0.9 / 4.0)


def test_lr_bound_off_logs_the_bound_but_keeps_the_rate():
    model = lm("linear")
    recipe = get_recipe("lgt-alg5.1", lr_bound="off")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0, grade_lr=5.0))
    info = recipe.on_step(model, opt, 0, 10)
    assert info["grade_lr_bound"] == pytest.approx(1.0) and info["grade_lr"] == 5.0
    with pytest.raises(ValueError, match="lr_bound"):
        get_recipe("lgt-alg5.1", lr_bound="sometimes")
    assert get_recipe("lgt-alg5.1", lr_bound=False).lr_bound == "off"  # YAML's bare `off`


def test_a_recipe_that_does_not_match_the_model_is_refused():
    with pytest.raises(ValueError, match="exponential"):
        get_recipe("lgt-alg5.1").check(lm("exponential", grading_base=2.0))
    with pytest.raises(ValueError, match="linear"):
        get_recipe("egt-alg7.1").check(lm("linear"))
    ungraded = TransformerLM(TransformerConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1,
                                               max_len=16))
    with pytest.raises(ValueError, match="no grading"):
        get_recipe("lgt-alg5.1").check(ungraded)
    get_recipe("plain").check(ungraded)
    get_recipe("lgt-alg5.1").check(lm("linear"))


@pytest.mark.parametrize("name, grading, options", [
    ("lgt-alg5.1", "linear", {}), ("egt-alg7.1", "exponential", {}),
    ("egt-alg7.1", "exponential", {"anneal": False})])
def test_start_step_then_finish_equals_on_step_and_reads_only_when_finished(name, grading,
                                                                            options,
                                                                            monkeypatch):
    """start_step does what needs no value; the returned function reads q_max (and a fixed λ)
    in one transfer, caps the grade learning rate and logs what on_step logs."""
    from torch.overrides import TorchFunctionMode

    class Reads(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__float__):
                Reads.n += 1
            return func(*args, **(kwargs or {}))

    from graded.grading import ExponentialGrading

    # EGT's overflow warning reads the exponents when λ changes, on the CPU only
    monkeypatch.setattr(ExponentialGrading, "_check_overflow", lambda self: None)
    runs = []
    for split in (False, True):
        model = lm(grading, grading_base=3.0, grade_init="warm_start", grade_init_value=1.5)
        recipe = get_recipe(name, **options)
        opt = torch.optim.AdamW(recipe.param_groups(model, lr=1.0, weight_decay=0.0))
        if split:
            Reads.n = 0
            with Reads():
                finish = recipe.start_step(model, opt, 4, 10)
            assert Reads.n == 0  # nothing read yet
            with Reads():
                logged = finish()
            assert Reads.n == 1 and finish() is logged  # one transfer, once
        else:
            logged = recipe.on_step(model, opt, 4, 10)
        lr = [g["lr"] for g in opt.param_groups if g.get("name") == "grades"]
        runs.append((logged, lr, [g.base.clone() if hasattr(g, "base") else None
                                  for g in gradings(model).values()]))
    (a, lr_a, base_a), (b, lr_b, base_b) = runs
    assert a == b and lr_a == lr_b and lr_a[0] < 1.0  # the bound capped it
    for x, y in zip(base_a, base_b):
        assert (x is None and y is None) or torch.equal(x, y)


@pytest.mark.parametrize(("grading", "recipe_name"),
                         [("linear", "lgt-alg5.1"), ("exponential", "egt-alg7.1")])
def test_grade_lr_bound_caps_grades_in_a_group_built_without_the_recipe(grading, recipe_name):
    # an optimizer built by hand, grades in a group of their own but not named "grades": the
    # bound used to be skipped silently, leaving η_q = 0.5 above 1/q_max
    model = lm(grading, grade_init="warm_start", grade_init_value=0.5, grading_base=2.5)
    recipe = get_recipe(recipe_name)
    grades = [p for n, p in model.named_parameters() if n.endswith("grades")]
    others = [p for n, p in model.named_parameters() if not n.endswith("grades")]
    opt = torch.optim.AdamW([{"params": others}, {"params": grades, "lr": 0.5}], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)  # resets the rate each step
    steps = 6
    recipe.on_step(model, opt, 0, steps)
    x = torch.randint(0, 11, (4, 6))
    for s in range(steps):
        gs = list(gradings(model).values())
        if grading == "linear":  # q_max = the largest entry of M = diag(f(q)), f(q) = q + 1
            q_max = max(float(g.grades.detach().max()) + 1.0 for g in gs)
            bound = 1.0 / q_max
        else:
            lam = 1.0 + 1.5 * (s + 1) / steps
            q_max = max(float(g.grades.detach().max()) for g in gs)
            bound = 1.0 / (lam**q_max * math.log(lam))
        assert opt.param_groups[1]["lr"] == pytest.approx(min(0.5, 0.9 * bound))
        assert opt.param_groups[0]["lr"] == 1e-3  # the other parameters keep their rate
        loss = sequence_cross_entropy(model(x)[:, :-1], x[:, 1:]) - sum(g.grades.sum()
                                                                         for g in gs)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        recipe.on_step(model, opt, s + 1, steps)


def test_grades_sharing_a_group_with_other_parameters_are_refused():
    model = lm("linear", grade_init="warm_start", grade_init_value=0.5)
    n_grades = sum(n.endswith("grades") for n, _ in model.named_parameters())
    n_other = sum(not n.endswith("grades") for n, _ in model.named_parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=0.5)
    with pytest.raises(ValueError, match=rf"group '#0' holds {n_grades} grade parameter\(s\) "
                                         rf"together with {n_other} other\(s\)"):
        get_recipe("lgt-alg5.1").on_step(model, opt, 0, 10)
    assert opt.param_groups[0]["lr"] == 0.5
    # with the bound off there is nothing to cap: the rate stands
    info = get_recipe("lgt-alg5.1", lr_bound="off").on_step(model, opt, 0, 10)
    assert info["grade_lr"] == 0.5 and opt.param_groups[0]["lr"] == 0.5


def test_recipe_options_are_checked_naming_the_value():
    # graded.checks.check_float's refusals: the option, the value and the range
    cases = [({"gamma": -1.0}, r"gamma must be >= 0, got -1\.0"),
             ({"gamma_heads": math.nan},
              r"gamma_heads must be a finite number, got nan \(expected >= 0\)"),
             ({"gamma_coord": "1e-4"}, r"gamma_coord must be a number >= 0, got '1e-4' \(str\)"),
             ({"gamma": True}, r"gamma must be a number >= 0, got True \(bool\)"),
             ({"lambda_max": 0.5}, r"lambda_max \(None for the model's base\) must be > 1, "
                                   r"got 0\.5"),
             ({"lambda_max": math.inf}, r"lambda_max .* must be a finite number, got inf "
                                        r"\(expected > 1\)"),
             ({"clip_norm": 0.0}, r"clip_norm \(None or false for no clipping\) must be > 0, "
                                  r"got 0\.0"),
             ({"clip_norm": -math.inf}, r"clip_norm .* must be a finite number, got -inf"),
             ({"lr_margin": True}, r"lr_margin must be a number in \(0, 1\], got True"),
             ({"lr_margin": 1.5}, r"lr_margin must be <= 1, got 1\.5")]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            get_recipe("egt-alg7.1", **options)
    with pytest.raises(ValueError, match=r"kind='quadratic'; expected one of"):
        Recipe(kind="quadratic")
    # λ annealing on an LGT recipe did nothing, silently
    with pytest.raises(ValueError, match=r"anneal=True: λ is the base of an exponential "
                                         r"grading, but recipe 'lgt-alg5.1' has kind 'linear'"):
        get_recipe("lgt-alg5.1", anneal=True)
    with pytest.raises(ValueError, match=r"lambda_max=3\.0: .* kind 'linear'"):
        get_recipe("lgt-alg5.1", lambda_max=3.0)
    ok = get_recipe("egt-alg7.1", gamma=0, lambda_max=3, clip_norm=None)
    assert (ok.gamma, ok.lambda_max, ok.clip_norm) == (0, 3, None)
    # false is None (TOML has no null): no clipping, the model's base
    off = get_recipe("egt-alg7.1", lambda_max=False, clip_norm=False)
    assert (off.lambda_max, off.clip_norm) == (None, None)
    # a 0-d tensor is a number
    assert get_recipe("lgt-alg5.1", gamma=torch.tensor(0.5)).gamma == 0.5


def test_annealing_resumed_mid_run_continues_the_schedule_to_lambda_max():
    # a run interrupted after 40 of 100 steps: a fresh model (base λ = 3 from its config) told
    # that 40 steps are done gets λ_41, as the uninterrupted run had; the last step gets λ_max
    steps, lam_max = 100, 3.0
    uninterrupted = lm("exponential", grading_base=lam_max)
    resumed = lm("exponential", grading_base=lam_max)
    recipe = get_recipe("egt-alg7.1")
    opt_a = torch.optim.AdamW(recipe.param_groups(uninterrupted, lr=1e-3, weight_decay=0.0))
    opt_b = torch.optim.AdamW(recipe.param_groups(resumed, lr=1e-3, weight_decay=0.0))
    for done in range(41):
        recipe.on_step(uninterrupted, opt_a, done, steps)
    info = recipe.on_step(resumed, opt_b, 40, steps)
    expected = 1.0 + (lam_max - 1.0) * 41 / steps
    assert info["lambda"] == pytest.approx(expected, rel=1e-12)
    assert float(resumed.feature_grading.base) == float(uninterrupted.feature_grading.base)
    assert recipe.on_step(resumed, opt_b, steps - 1, steps)["lambda"] == lam_max


def test_grade_lr_follows_the_current_bound_without_a_scheduler():
    # no scheduler resets the rate: after large grades tightened the bound, smaller grades
    # must give the rate back (min(η, 0.9/q_max) now), not keep the tightest cap ever applied
    model = lm("linear")
    recipe = get_recipe("lgt-alg5.1")
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0, grade_lr=0.5))
    group = next(g for g in opt.param_groups if g["name"] == "grades")
    for top, expected in ((3.0, 0.9 / 4.0), (0.0, 0.5), (1.0, 0.45), (7.0, 0.9 / 8.0)):
        with torch.no_grad():  # f(q) = q + 1: the largest entry of M is top + 1
            for g in gradings(model).values():
                g.grades.fill_(0.0).view(-1)[0] = top
        recipe.on_step(model, opt, 0, 10)
        assert group["lr"] == pytest.approx(expected)
    group["lr"] = 0.01  # a rate set by hand (or a scheduler) below the bound stands
    recipe.on_step(model, opt, 1, 10)
    assert group["lr"] == 0.01


def test_regulariser_gradients_equal_hand_computation():
    # ∂/∂q γ‖q‖² = 2γq; ∂/∂Q (γ′‖Q‖² + γ_c Σ_i‖Q_i − mean_j Q_j‖²) = 2γ′Q + 2γ_c(Q − mean),
    # the mean's own derivative summing to zero over the heads
    model = lm("exponential", grades_per_head=True)
    feature = model.feature_grading
    (head,) = head_gradings(model)
    q = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 0.25, 3.0, 1.0])
    heads = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 0.5, 1.0, 2.0]])
    with torch.no_grad():
        feature.grades.copy_(q)
        head.grades.copy_(heads)
    gamma, gamma_heads, gamma_coord = 0.5, 0.25, 2.0
    recipe = get_recipe("egt-alg7.1", gamma=gamma, gamma_heads=gamma_heads,
                        gamma_coord=gamma_coord)
    recipe.regularization(model).backward()
    torch.testing.assert_close(feature.grades.grad, 2 * gamma * q)
    mean = [(heads[0, k] + heads[1, k]) / 2 for k in range(4)]
    expected = torch.tensor([[2 * gamma_heads * heads[i, k] + 2 * gamma_coord * (heads[i, k]
                                                                                 - mean[k])
                              for k in range(4)] for i in range(2)])
    torch.testing.assert_close(head.grades.grad, expected)


def test_grade_groups_are_found_again_when_the_optimizer_gains_a_group():
    # the grade groups are kept per optimizer (host time per step); a group added later
    # (torch's add_param_group) must still be capped
    model = lm("linear", grade_init="warm_start", grade_init_value=0.5)
    recipe = get_recipe("lgt-alg5.1")
    grades = [p for n, p in model.named_parameters() if n.endswith("grades")]
    others = [p for n, p in model.named_parameters() if not n.endswith("grades")]
    opt = torch.optim.AdamW([{"params": others}], lr=1e-3)
    recipe.on_step(model, opt, 0, 10)
    assert opt.param_groups[0]["lr"] == 1e-3  # no grades: nothing capped
    opt.add_param_group({"params": grades, "lr": 0.5})
    recipe.on_step(model, opt, 1, 10)
    q_max = max(float(g.grades.detach().max()) + 1.0 for g in gradings(model).values())
    assert opt.param_groups[1]["lr"] == pytest.approx(0.9 * (1.0 / q_max))
    assert opt.param_groups[0]["lr"] == 1e-3


def _egt_bound_exact(q_max: float, lam: float) -> float:
    """1/(λ^{q_max} ln λ) in 60-digit decimal arithmetic: no float overflow on the way."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        lam_d = decimal.Decimal(lam)
        return float(1 / ((decimal.Decimal(q_max) * lam_d.ln()).exp() * lam_d.ln()))


@pytest.mark.parametrize(("q_max", "lam"), [(71400.0, 1.01), (2.0, 3.0), (1025.0, 2.0)])
def test_egt_lr_bound_where_lambda_to_the_q_max_overflows_a_float(q_max, lam):
    # 1.01^71400 ≈ e^710.4 is beyond the largest float (the bound, ≈ 4.6e-307, is not):
    # λ ** q_max raised OverflowError
    assert grade_lr_bound("exponential", q_max, lam) == pytest.approx(
        _egt_bound_exact(q_max, lam), rel=1e-12)
    assert grade_lr_bound("exponential", 1e6, 10.0) == 0.0  # 10^-1e6: below every float


def test_egt_recipe_caps_the_grade_lr_when_grades_are_huge():
    # grades that grew large (the scales are clamped, with a warning): on_step raised
    # OverflowError; the cap is lr_margin·1/(λ^{q_max} ln λ)
    model = lm("exponential", grading_base=1.01)
    recipe = get_recipe("egt-alg7.1", anneal=False)
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0, grade_lr=0.5))
    with torch.no_grad():
        model.feature_grading.grades.fill_(71400.0)
    lam = float(model.feature_grading.base)  # 1.01 in float32
    info = recipe.on_step(model, opt, 0, 10)
    group = next(g for g in opt.param_groups if g["name"] == "grades")
    assert info["q_max"] == 71400.0
    assert group["lr"] == pytest.approx(0.9 * _egt_bound_exact(71400.0, lam), rel=1e-9)


@pytest.mark.parametrize("lam_max", [math.nan, math.inf, 1.0, True])
def test_anneal_lambda_refuses_a_lambda_max_that_is_not_a_finite_number_above_one(lam_max):
    # NaN and inf went through (λ_t = nan); the error names the value and the range
    with pytest.raises(ValueError, match=r"lambda_max must be .*, got (nan|inf|1\.0|True)"):
        anneal_lambda(5, 10, lam_max)


@pytest.mark.parametrize(("kind", "lam"), [("linear", None), ("exponential", 2.0),
                                           ("exponential", 1.0)])
def test_nan_grades_have_a_grade_lr_bound_of_zero_not_none(kind, lam):
    # a NaN q_max compared false with 0 (LGT: bound inf) or gave a NaN bound (EGT): the cap
    # was lifted and the grades took the scheduled rate
    assert grade_lr_bound(kind, math.nan, lam) == 0.0
    assert grade_lr_bound(kind, 2.0, lam) == (0.5 if kind == "linear" else
                                                (math.inf if lam == 1.0 else
                                                 1 / (4 * math.log(2))))


@pytest.mark.parametrize("where", ["float16 autocast", "float16 model", "bfloat16 model"])
@pytest.mark.parametrize(("grading", "recipe_name"), [("exponential", "egt-alg7.1"),
                                                      ("linear", "lgt-alg5.1")])
def test_loss_weights_of_a_half_precision_model_or_under_autocast_are_those_of_float32(
        where, grading, recipe_name):
    """Under float16 autocast, or for a float16 model, EGT's weights 3^5 and 3^10 were both
    94.15 (λ^q clamped where a float16 activation is, exp(4.5)); a bfloat16 model weighted
    grade 1 by 3.0156 and 10 by 59904 (λ^q in bfloat16), LGT grade 257 by 256, not 258."""
    model = lm(grading, grading_base=3.0)
    recipe = get_recipe(recipe_name)
    q = torch.tensor([0.0, 1.0, 5.0, 10.0, 0.1, 257.0])
    qd = q.double()
    expected = (3.0 ** qd).clamp(max=math.exp(0.5 * math.log(torch.finfo(torch.float32).max)
                                              - 1.0)) if grading == "exponential" else qd + 1
    if where == "float16 autocast":
        with torch.autocast("cpu", dtype=torch.float16):
            weights = recipe.loss_weights(model, q)
    else:
        model = model.to(torch.float16 if where == "float16 model" else torch.bfloat16)
        weights = recipe.loss_weights(model, q)
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights.double(), expected, rtol=2e-6, atol=0)


def test_lambda_max_without_annealing_is_refused_as_an_option_with_no_effect():
    """get_recipe("egt-alg7.1", anneal=False, lambda_max=3.0) was taken and trained at the
    model's base: nothing reads lambda_max without annealing."""
    with pytest.raises(ValueError, match=r"lambda_max=3\.0 with anneal=False would have no "
                                         r"effect: recipe 'egt-alg7\.1' anneals"):
        get_recipe("egt-alg7.1", anneal=False, lambda_max=3.0)
    with pytest.raises(ValueError, match=r"lambda_max=3\.0 with anneal=False"):
        get_recipe("egt-alg7.1", anneal=False).with_options(lambda_max=3.0)
    model = lm("exponential", grading_base=2.0)
    fixed = get_recipe("egt-alg7.1", anneal=False)
    opt = torch.optim.SGD(fixed.param_groups(model, lr=0.1, weight_decay=0.0), lr=0.1)
    assert fixed.on_step(model, opt, 0, 10)["lambda"] == 2.0  # the model's base
    annealed = get_recipe("egt-alg7.1", lambda_max=3.0)  # anneal=True: read
    assert annealed.on_step(model, opt, 4, 10)["lambda"] == pytest.approx(1 + 2.0 * 5 / 10)
