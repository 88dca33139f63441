"""The recipes minimise the graded loss of 000 Def 5.37 (LGT, weights f(q)) and Def 7.1 (EGT,
weights λ_t^q, λ_t annealed), with the grades q of graded.train.recipes: each target coordinate's
(regression), each class's (classification), each target token's (lm, seq2seq). Checked against
the double sum over items i and output dimensions k written out by hand, against the graded
losses of graded.losses, and through the trainer, the config and the plain-loss fallback."""

import json
import math

import pytest
import torch

from graded.config import apply_overrides, build_run, validate_config
from graded.kinds import get_kind
from graded.losses import exponentially_graded_loss, graded_cross_entropy, linearly_graded_loss
from graded.tasks import IGNORE_INDEX, get_task
from graded.tasks.polynomials import PolynomialArithmetic
from graded.train.options import TrainOptions
from graded.train.recipes import get_recipe
from graded.train.trainer import Trainer
from graded.transformer import TransformerConfig

RECIPE = {"linear": "lgt-alg5.1", "exponential": "egt-alg7.1"}
F = {"shift": lambda q: q + 1.0, "softplus": lambda q: math.log1p(math.exp(q))}
LAMBDA_MAX = 3.0
TASKS = {"lm": ("polynomials", {"max_degree": 2}),
         "seq2seq": ("polynomials_seq2seq", {"max_degree": 2}),
         "regression": ("weighted_projective", {}),
         "classification": ("listops", {"max_depth": 2, "max_args": 3})}
CLASS_GRADES = torch.arange(10.0) / 3  # listops declares none: a class grading for the test
GRADINGS = [("linear", "shift"), ("linear", "softplus"), ("exponential", "shift")]
OPTIONS = {"batch_size": 32, "lr": 1e-3, "eval_every": 1, "log_every": 1, "progress": False,
           "tensorboard": False, "device": "cpu", "warmup_steps": 0}


def model_for(task, grading, f="shift", *, dtype=torch.float64):
    info = task.info()
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=info["vocab_size"], input_dim=info["input_dim"],
                               pad_id=info["pad_id"], max_len=task.max_len, d_model=16,
                               n_heads=2, n_layers=1, d_ff=32, grading=grading, grading_f=f,
                               grading_base=LAMBDA_MAX, learnable_grades=True)
    return get_kind(task.kind).build_model(config, task).to(dtype)


def setup(kind_name, grading, f, n=6):
    name, options = TASKS[kind_name]
    task = get_task(name, **options)
    data = task.generate(n, seed=0)
    return task, data, dict(data.tensors), model_for(task, grading, f)


def output_grades(kind_name, task):
    """The grades of the output coordinates: the task's (regression), the test's (classes)."""
    if kind_name == "regression":
        return torch.tensor(task.output_grades)
    return CLASS_GRADES if kind_name == "classification" else None


def log_softmax_row(row):
    top = max(row)
    log_z = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - log_z for v in row]


def target_token_grades(task, data):
    """The grade of every target token, from the tokens themselves (the monomial degree of a
    coefficient, 0 for special tokens), not from the token_grades tensor."""
    if task.kind == "lm":
        degrees = [PolynomialArithmetic.token_degrees(toks) for toks in task.examples(data)]
        return lambda b, t: degrees[b][t + 1]  # the target at t is token t + 1
    targets = data.targets
    degrees = [PolynomialArithmetic.token_degrees(
        ["=", *task.vocab.decode(row[row != IGNORE_INDEX])])[1:] for row in targets]
    return lambda b, t: degrees[b][t]


def naive_graded_loss(kind_name, task, data, output, weight_of):
    """Σ_i Σ_k w(q_k) ℓ(ŷ_ik, y_ik) written out: (sum, number of items)."""
    y = data.targets
    total, count = 0.0, 0
    if kind_name == "regression":  # ℓ = squared error, q_k the grade of target column k
        q = task.output_grades
        for i in range(y.shape[0]):
            for k in range(y.shape[1]):
                total += weight_of(q[k]) * (float(output[i, k]) - float(y[i, k])) ** 2
                count += 1
    elif kind_name == "classification":  # ℓ_k = −y_k log p_k, q_k the grade of class k
        for i in range(y.shape[0]):
            logp = log_softmax_row(output[i].tolist())
            for k in range(len(logp)):
                y_ik = 1.0 if k == int(y[i]) else 0.0
                total += weight_of(float(CLASS_GRADES[k])) * (-y_ik * logp[k])
            count += 1
    else:  # the decision for tokens: each target token i weighted by its own grade
        grade = target_token_grades(task, data)
        for b in range(y.shape[0]):
            for t in range(y.shape[1]):
                if int(y[b, t]) == IGNORE_INDEX:
                    continue
                logp = log_softmax_row(output[b, t].tolist())
                total += weight_of(grade(b, t)) * -logp[int(y[b, t])]
                count += 1
    return total, count


def recipe_at_step(model, grading, step, total):
    """The recipe after ``step`` optimizer steps of ``total`` (EGT: λ_{step+1} annealed)."""
    recipe = get_recipe(RECIPE[grading])
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0))
    recipe.on_step(model, opt, step, total)
    return recipe


def weight_function(grading, f, lam):
    return F[f] if grading == "linear" else (lambda q: lam ** q)


@pytest.mark.parametrize("kind_name", list(TASKS))
@pytest.mark.parametrize(("grading", "f"), GRADINGS)
def test_recipe_loss_equals_the_graded_loss_written_out(kind_name, grading, f):
    task, data, batch, model = setup(kind_name, grading, f)
    recipe = recipe_at_step(model, grading, 3, 10)
    lam = 1.0 + (LAMBDA_MAX - 1.0) * 4 / 10  # λ_4 of 000 Alg 7.1 with T = 10
    kind = get_kind(task.kind)
    weights = recipe.loss_weights(model, kind.loss_grades(batch, output_grades(kind_name, task)))
    got = kind.loss(model, batch, weights=weights)
    with torch.no_grad():
        output = kind.raw_prediction(kind.forward(model, batch), batch)
    want, count = naive_graded_loss(kind_name, task, data, output,
                                    weight_function(grading, f, lam))
    assert got.count == count == kind.loss_count(batch)
    assert float(got.total.detach()) == pytest.approx(want, rel=1e-5)  # scored in float32
    assert float(got.total.detach()) != pytest.approx(float(kind.loss(model, batch).total.detach()),
                                                      rel=1e-3)


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_regression_and_classification_losses_are_those_of_graded_losses(grading):
    """Summed over the batch, the recipe loss is linearly_graded_loss (weights f(q)) or
    exponentially_graded_loss (grades q, base λ_t) with squared error, and graded_cross_entropy
    with the class weights: Eq. 63 / Def 7.1 as graded.losses implements them."""
    task, _, batch, model = setup("regression", grading, "shift")
    recipe = recipe_at_step(model, grading, 3, 10)
    lam = 1.0 + (LAMBDA_MAX - 1.0) * 4 / 10
    q = torch.tensor(task.output_grades, dtype=torch.float64)
    kind = get_kind("regression")
    got = kind.loss(model, batch, weights=recipe.loss_weights(model, kind.loss_grades(batch, q)))
    with torch.no_grad():
        pred = kind.raw_prediction(kind.forward(model, batch), batch)
    y = batch["targets"].double()
    want = (linearly_graded_loss(pred, y, q + 1.0, reduction="sum") if grading == "linear"
            else exponentially_graded_loss(pred, y, q, base=lam, reduction="sum"))
    assert float(got.total.detach()) == pytest.approx(float(want), rel=1e-5)

    task, _, batch, model = setup("classification", grading, "shift")
    recipe = recipe_at_step(model, grading, 3, 10)
    kind = get_kind("classification")
    grades = kind.loss_grades(batch, CLASS_GRADES)
    got = kind.loss(model, batch, weights=recipe.loss_weights(model, grades))
    with torch.no_grad():
        logits = kind.forward(model, batch)
    w = CLASS_GRADES.double() + 1.0 if grading == "linear" else lam ** CLASS_GRADES.double()
    want = graded_cross_entropy(logits, batch["targets"], w, reduction="sum")
    assert float(got.total.detach()) == pytest.approx(float(want), rel=1e-5)


def test_target_tokens_take_the_grade_of_the_token_they_predict():
    """token_grades are aligned with the inputs; the weight of the target at t is the grade of
    token t + 1: in '= r0 r1 r2 <eos>' the coefficients get degrees 0, 1, 2 and <eos> 0."""
    task = get_task("polynomials", max_degree=2)
    data = task.generate(4, seed=0)
    q = get_kind("lm").loss_grades(data.tensors)
    for b, toks in enumerate(task.examples(data)):
        scored = data.targets[b] != IGNORE_INDEX
        answer = toks[toks.index("=") + 1:]
        assert q[b][scored].tolist() == [*range(len(answer) - 1), 0]


@pytest.mark.parametrize("kind_name", list(TASKS))
def test_weights_all_one_and_graded_loss_false_give_the_plain_loss_exactly(kind_name):
    task, _, batch, model = setup(kind_name, "exponential", "shift")
    kind = get_kind(task.kind)
    grades = kind.loss_grades(batch, output_grades(kind_name, task))
    plain = kind.loss(model, batch)
    ones = kind.loss(model, batch, weights=torch.ones(grades.shape))
    assert torch.equal(ones.total, plain.total) and ones.count == plain.count
    recipe = get_recipe("egt-alg7.1")
    for g in model.modules():  # λ = 1, the start of the annealing: every weight λ^q is 1
        if hasattr(g, "set_base"):
            g.set_base(1.0)
    assert torch.equal(kind.loss(model, batch, weights=recipe.loss_weights(model, grades)).total,
                       plain.total)
    assert get_recipe("egt-alg7.1", graded_loss=False).loss_weights(model, grades) is None
    assert get_recipe("plain").loss_weights(model, grades) is None


def first_step_loss(trainer, data, weights):
    """The loss of the trainer's initial model on all of ``data`` (its first batch)."""
    with torch.no_grad():
        return float(trainer.kind.loss(trainer.model, data, weights=weights).mean)


@pytest.mark.parametrize(("task_name", "grading"), [("weighted_projective", "exponential"),
                                                    ("polynomials", "linear")])
def test_the_trainer_minimises_the_graded_loss(tmp_path, task_name, grading):
    """The first logged loss is the graded loss of the initial model on the first batch (all
    of the data): output grades weighted by λ_1^q, λ_1 = 1 + (λ_max − 1)/T (EGT), target
    tokens by f(q) = q + 1 (LGT)."""
    task = get_task(task_name, **({"max_degree": 2} if task_name == "polynomials" else {}))
    train, test = task.split("random", 32, 8, seed=1)
    model = model_for(task, grading, dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, train.tensors, test.tensors, kind=task.kind,
                      options=TrainOptions(steps=4, **OPTIONS), run_dir=tmp_path / "run",
                      recipe=RECIPE[grading], output_grades=task.output_grades)
    assert trainer.graded_loss and trainer.plain_loss_note is None
    result = trainer.fit(pause_after=1)
    model.load_state_dict(before)
    if grading == "exponential":
        lam = 1.0 + (LAMBDA_MAX - 1.0) / 4
        weights = torch.tensor([[lam ** q for q in task.output_grades]]).expand(32, -1)
    else:
        weights = trainer.kind.loss_grades(train.tensors).float() + 1.0
    assert result.losses[0] == pytest.approx(first_step_loss(trainer, train.tensors, weights),
                                             rel=1e-5)
    assert result.losses[0] != pytest.approx(first_step_loss(trainer, train.tensors, None),
                                             rel=1e-2)


def test_a_task_without_output_grades_trains_on_the_plain_loss_and_says_so_once(tmp_path):
    task = get_task("polynomial_regression")
    assert task.output_grades is None
    train, test = task.split("random", 32, 8, seed=1)
    model = model_for(task, "linear", dtype=torch.float32)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model, train.tensors, test.tensors, kind=task.kind,
                      options=TrainOptions(steps=2, **OPTIONS), run_dir=tmp_path / "run",
                      recipe="lgt-alg5.1", output_grades=task.output_grades)
    assert not trainer.graded_loss
    with pytest.warns(RuntimeWarning, match="output_grades.*plain loss") as caught:
        result = trainer.fit()
    assert sum("plain loss" in str(w.message) for w in caught) == 1  # once, not per step
    history = [json.loads(ln) for ln in (tmp_path / "run" / "history.jsonl").read_text()
               .splitlines()]
    notes = [e for e in history if e["event"] == "warning"]
    assert len(notes) == 1 and "plain loss" in notes[0]["message"]
    model.load_state_dict(before)
    assert result.losses[0] == pytest.approx(first_step_loss(trainer, train.tensors, None),
                                             rel=1e-5)


def test_negative_loss_weights_are_refused_when_the_trainer_is_built(tmp_path):
    task = get_task("weighted_projective")
    train, _ = task.split("random", 8, 4, seed=1)
    model = model_for(task, "linear", "shift", dtype=torch.float32)
    with pytest.raises(ValueError, match=r"grades \[-3.0\] negative loss weights"):
        Trainer(model, train.tensors, None, kind=task.kind, options=TrainOptions(**OPTIONS),
                run_dir=tmp_path / "run", recipe="lgt-alg5.1", output_grades=[-3.0, 1, 2, 3])


@pytest.mark.parametrize(("grading", "bad"), [("linear", math.nan), ("exponential", math.nan),
                                              ("linear", math.inf)])
def test_output_grades_that_are_not_finite_are_refused_when_the_trainer_is_built(tmp_path,
                                                                                 grading, bad):
    """A NaN output grade made every step's loss NaN: the run stopped at a step with "lower lr
    or a smaller clip_norm"."""
    task = get_task("weighted_projective")
    train, _ = task.split("random", 8, 4, seed=1)
    model = model_for(task, grading, "shift", dtype=torch.float32)
    with pytest.raises(ValueError, match=rf"output_grades, or token grades\) must be finite "
                                         rf"numbers; got {bad}"):
        Trainer(model, train.tensors, None, kind=task.kind, options=TrainOptions(**OPTIONS),
                run_dir=tmp_path / "run", recipe=RECIPE[grading],
                output_grades=[1.0, bad, 2.0, 3.0])
    assert not (tmp_path / "run").exists()


def test_config_and_set_override_reach_the_trainer(tmp_path):
    """A run config trains on the graded loss with the task's output grades;
    ``--set recipe.options.graded_loss=false`` (on the shorthand ``recipe: auto``) turns it
    off, with no warning."""
    base = {"name": "wp", "task": {"name": "weighted_projective", "n_train": 32, "n_eval": 8},
            "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "grading": "exponential"},
            "recipe": "auto", "train": {**OPTIONS, "steps": 1},
            "output": {"dir": str(tmp_path)}}
    parts = build_run(validate_config(base))
    assert parts.trainer.graded_loss
    assert parts.trainer.output_grades.tolist() == [2.0, 4.0, 6.0, 10.0]
    off = validate_config(apply_overrides(base, ["recipe.options.graded_loss=false"]))
    assert off.built_recipe.name == "egt-alg7.1" and off.built_recipe.graded_loss is False
    trainer = build_run(off).trainer
    assert not trainer.graded_loss and trainer.plain_loss_note is None


def test_the_summary_and_the_report_say_which_runs_trained_on_the_graded_loss(tmp_path):
    """metrics.json names the objective of train_loss; the run report marks a graded training
    loss and says that it does not compare with a plain one (the eval losses are plain)."""
    from graded.train.report import write_runs_report

    task = get_task("polynomials", max_degree=2)
    train, test = task.split("random", 32, 8, seed=1)
    runs = {}
    for name, recipe in [("graded", "lgt-alg5.1"), ("plain", None)]:
        model = model_for(task, "linear", dtype=torch.float32)
        trainer = Trainer(model, train.tensors, test.tensors, kind=task.kind,
                          options=TrainOptions(steps=2, **OPTIONS), run_dir=tmp_path / name,
                          recipe=recipe)
        result = trainer.fit()
        summary = json.loads((tmp_path / name / "metrics.json").read_text())
        assert summary["train_objective"] == name
        assert summary["train_loss"] == pytest.approx(result.losses[-1])
        runs[name] = summary
    report = write_runs_report([tmp_path / "graded", tmp_path / "plain"], tmp_path / "rep")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in report.read_text().splitlines()
            if line.startswith("| graded |") or line.startswith("| plain |")}
    assert f"{runs['graded']['train_loss']:.4g} (graded)" in rows["graded"]
    assert "(graded)" not in rows["plain"]
    assert "not comparable with another run's" in report.read_text()
