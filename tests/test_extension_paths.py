"""The extension paths of README.md "Extending", followed from outside the library: each new
choice registers, builds, trains a step through the Trainer (and resumes), and is the one used;
a bad or duplicate registration is refused by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from graded import TransformerClassifier, TransformerConfig
from graded.attention.backends import available_backends, register_backend
from graded.attention.backends.base import AttentionBackend
from graded.attention.backends.dense import FullBackend
from graded.kinds import LossSum, Regression, get_kind
from graded.kinds.base import _REGISTRY as KIND_REGISTRY
from graded.kinds.rows import Regression as LibraryRegression
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer
from graded.transformer.embedding import InputEmbedding

VOCAB, LENGTH = 12, 8
OPTIONS = {"batch_size": 16, "lr": 1e-2, "eval_every": 2, "log_every": 1, "progress": False,
           "tensorboard": False, "device": "cpu", "warmup_steps": 1}


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, LENGTH), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def kinds_restored():
    saved = dict(KIND_REGISTRY)
    yield
    KIND_REGISTRY.clear()
    KIND_REGISTRY.update(saved)


class _MeanRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None):
        return self.out(self.embed(x).mean(dim=1)).squeeze(-1)


def test_a_new_task_kind_trains_saves_and_resumes_with_its_own_loss(tmp_path, kinds_restored):
    """docs/training.md "How to extend: a new task kind": a Regression subclass with a name and
    its own loss (absolute error, against a sum over the rows) is what the Trainer trains."""
    calls = []

    class AbsoluteRegression(Regression):
        name = "absolute_regression"

        def output_loss(self, output, batch, *, label_smoothing=0.0, weights=None, count=None):
            calls.append(output.shape[0])
            error = (self.raw_prediction(output, batch).float() - batch["targets"]).abs()
            return LossSum(error.sum(), self._count(batch, count))

    assert type(get_kind("absolute_regression")) is AbsoluteRegression
    x = _tokens(64, 1)
    data = {"inputs": x, "targets": x.float().mean(dim=1)}
    held = {"inputs": _tokens(32, 2), "targets": _tokens(32, 2).float().mean(dim=1)}

    def trainer(run):
        torch.manual_seed(0)
        return Trainer(_MeanRegressor(), data, held, kind="absolute_regression", run_dir=run,
                       seed=0, options=TrainOptions(steps=2, **OPTIONS))

    first = trainer(tmp_path / "run").fit(pause_after=1)
    assert first.step == 1 and calls
    model = trainer(tmp_path / "check").model
    batch = {k: v[:16] for k, v in data.items()}
    with torch.no_grad():
        loss = get_kind("absolute_regression").loss(model, batch)
        expected = sum(abs(float(p) - float(t)) for p, t in
                       zip(model(batch["inputs"]), batch["targets"], strict=True))
    assert float(loss.total) == pytest.approx(expected, rel=1e-5) and loss.count == 16
    rest = trainer(tmp_path / "run").fit(resume_from=tmp_path / "run")
    assert rest.step == 2


def test_a_kind_subclass_without_its_own_name_leaves_the_library_kind_in_place(kinds_restored):
    """A helper subclass that sets no name inherits its parent's: it must not replace the
    library's kind for every task of that kind."""

    class Helper(LibraryRegression):
        def output_loss(self, output, batch, *, label_smoothing=0.0, weights=None, count=None):
            raise AssertionError("the helper is not a kind")

    assert type(get_kind("regression")) is LibraryRegression


def test_a_second_kind_under_a_taken_name_is_refused_naming_both(kinds_restored):
    with pytest.raises(ValueError, match=r"task kind 'regression' .* already registered to "
                                         r"graded\.kinds\.rows\.Regression; .*Mine needs "
                                         r"another name"):
        class Mine(LibraryRegression):
            name = "regression"

    assert type(get_kind("regression")) is LibraryRegression
    with pytest.raises(TypeError, match=r"task kind .*Named: name and architecture must be "
                                        r"strings, got name=3"):
        class Named(LibraryRegression):
            name = 3


def test_a_registered_backend_serves_the_model_through_training(tmp_path):
    """docs/cli.md "a new choice": a backend class registered with register_backend is
    accepted by the model config and its forward is the one the model calls."""
    calls = []

    class CountingBackend(FullBackend):
        name = "counting_full"

        def forward(self, q, k, v, **kwargs):
            calls.append(q.shape)
            return super().forward(q, k, v, **kwargs)

    from graded.attention.backends import _REGISTRY as BACKENDS

    register_backend(CountingBackend)
    try:
        assert "counting_full" in available_backends()
        with pytest.raises(ValueError, match=r"backend name 'full' is already registered to "
                                             r"FullBackend"):
            register_backend(type("Other", (FullBackend,), {"name": "full"}))
        with pytest.raises(ValueError, match=r"backend class Nameless needs a non-empty"):
            register_backend(type("Nameless", (AttentionBackend,), {}))
        torch.manual_seed(0)
        cfg = TransformerConfig(vocab_size=VOCAB, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                                max_len=LENGTH, positional="learned",
                                attn_backend="counting_full")
        x = _tokens(64, 1)
        result = Trainer(TransformerClassifier(cfg, 3), {"inputs": x, "targets": x.sum(1) % 3},
                         {"inputs": x[:16], "targets": x[:16].sum(1) % 3},
                         kind="classification", run_dir=tmp_path / "run", seed=0,
                         options=TrainOptions(steps=2, **OPTIONS)).fit()
        assert result.step == 2 and calls and calls[0][1] == 2  # (B, H, T, D): two heads
    finally:
        BACKENDS.pop("counting_full", None)


def test_a_positional_name_the_embedding_does_not_build_is_refused_not_dropped():
    """Adding a name to graded.positional.POSITIONAL without its construction used to build a
    model with no positional encoding at all; the embedding now says where to add it."""
    cfg = TransformerConfig(vocab_size=VOCAB, d_model=8, n_heads=2, n_layers=1, d_ff=16,
                            max_len=LENGTH).model_copy(update={"positional": "my_positions"})
    with pytest.raises(NotImplementedError, match=r"positional encoding 'my_positions' is "
                                                  r"listed .*graded/transformer/embedding\.py"):
        InputEmbedding(cfg)


# ---- choices listed once by the module that implements them (docs/cli.md "a new choice") ----
# Each test follows the table literally: it edits that one module in a copy of the package and
# runs a config naming the new choice through validation, `graded train --help`, one training
# step (and a resume) in a fresh process.

_RUN = """
import sys
from graded.config import build_run, describe_schema, validate_config
data = {{"name": "ext", "seed": 0, "recipe": {recipe!r}, "task": {task}, "model": {model},
        "train": {{"steps": 2, "batch_size": 8, "warmup_steps": 1, "eval_every": 1,
                  "progress": False, "tensorboard": False, "device": "cpu"}},
        "output": {{"dir": sys.argv[1], "plots": False}}}}
assert {listed!r} in describe_schema()  # `graded train --help`
parts = build_run(validate_config(data))
parts.trainer.fit(pause_after=1)
parts = build_run(validate_config(data))
result = parts.trainer.fit(resume_from=parts.trainer.run_dir)
assert result.step == 2, result.step
{check}
"""


def _run_edited(tmp_path, module: str, edits: list[tuple[str, str]], *, model: dict,
                check: str, listed: str, recipe: str = "auto", task: dict | None = None) -> None:
    """Copy the package, make ``edits`` (anchor, replacement) in ``module`` alone, and run a
    config with ``model`` options (added to a small transformer on a modular task, unless
    ``task`` is given) through validation, two steps with a resume, and ``check``."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    import graded

    root = tmp_path / "src"
    shutil.copytree(Path(graded.__file__).parent, root / "graded",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "graded" / module
    text = path.read_text()
    for anchor, replacement in edits:
        assert text.count(anchor) == 1, f"{module} no longer holds {anchor!r}"
        text = text.replace(anchor, replacement)
    path.write_text(text)
    if task is None:
        task = {"name": "modular", "options": {"p": 7, "train_fraction": 0.5},
                "n_train": 24, "n_eval": 24}
        model = {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16,
                 "positional": "learned", "pooling": "last", **model}
    script = _RUN.format(task=task, model=model, recipe=recipe, listed=listed, check=check)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "runs")],
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_a_new_lgt_function_is_one_entry_of_the_linear_module(tmp_path):
    """f(q) = q² + 1 (neutral grade 0), added as one entry of graded/grading/linear.py."""
    _run_edited(
        tmp_path, "grading/linear.py",
        [('    "identity": (lambda q: q, 1.0),\n',
          '    "identity": (lambda q: q, 1.0),\n'
          '    "square_shift": (lambda q: q * q + 1.0, 0.0),\n')],
        model={"grading": "linear", "grading_f": "square_shift", "learnable_grades": True},
        listed="one of shift, abs_shift, softplus, identity, square_shift",
        check="""
import torch
from graded.grading import LinearGrading
maps = [m for m in parts.model.modules() if isinstance(m, LinearGrading)]
assert maps and all(m.f == "square_shift" for m in maps)
q = maps[0].grades.detach()
assert torch.allclose(maps[0].scales(), q * q + 1.0)
assert LinearGrading(3, f="square_shift").grades.eq(0).all()  # the neutral grade
""")


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_a_new_score_function_is_listed_and_built_by_the_scores_module(tmp_path):
    """A negated scaled dot product, s(q, k) = −q·k/√d, added to SCORES and make_score."""
    _run_edited(
        tmp_path, "attention/scores.py",
        [('SCORES = ("scaled_dot", "dot", "bilinear", "additive")',
          'class NegatedScore(Score):\n'
          '    calls = 0\n\n'
          '    def forward(self, q, k):\n'
          '        NegatedScore.calls += 1\n'
          '        return -(q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5\n\n\n'
          'SCORES = ("scaled_dot", "dot", "bilinear", "additive", "negated")'),
         ('    # a new score adds its branch above this line',
          '    if name == "negated":\n        return NegatedScore()\n'
          '    # a new score adds its branch above this line')],
        model={"attn_score": "negated", "attn_backend": "explicit"},
        listed="one of scaled_dot, dot, bilinear, additive, negated",
        check="""
from graded.attention.scores import NegatedScore
assert NegatedScore.calls > 0
assert any(isinstance(m, NegatedScore) for m in parts.model.modules())
""")


@pytest.mark.slow  # a subprocess run of 6 s on 2 cores: `pytest -m slow`
def test_a_new_graded_attention_variant_is_a_name_and_its_graded_parts(tmp_path):
    """docs/models.md "A graded-attention variant": keys only, softmax(Q (KM)ᵀ/√d) V."""
    _run_edited(
        tmp_path, "attention/graded.py",
        [('VARIANTS = ("scores", "queries_keys", "values", "multi_head")',
          'VARIANTS = ("scores", "queries_keys", "values", "multi_head", "keys")'),
         ('"multi_head": ("q",)}', '"multi_head": ("q",), "keys": ("k",)}')],
        model={"grading": "linear", "grade_attention_variant": "keys",
               "learnable_grades": True},
        listed="one of scores, queries_keys, values, multi_head, keys",
        check="""
import torch
from graded.attention.graded import GradedMultiheadAttention, graded_parts
layers = [m for m in parts.model.modules() if isinstance(m, GradedMultiheadAttention)]
assert layers and all(m.variant == "keys" for m in layers) and graded_parts("keys") == ("k",)
""")


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_a_new_recipe_is_one_entry_of_recipes_and_auto_keeps_the_papers(tmp_path):
    _run_edited(
        tmp_path, "train/recipes.py",
        [('"egt-alg7.1": Recipe(',
          '"lgt-slow": Recipe(name="lgt-slow", kind="linear", gamma=1e-6, gamma_coord=1e-6),\n'
          '    "egt-alg7.1": Recipe(')],
        model={"grading": "linear", "learnable_grades": True}, recipe="lgt-slow",
        listed="one of auto, plain, lgt-alg5.1, lgt-slow, egt-alg7.1",
        check="""
assert parts.trainer.recipe.name == "lgt-slow" and parts.trainer.recipe.gamma == 1e-6
data["recipe"] = "auto"
assert validate_config(data).recipe_name() == "lgt-alg5.1"
""")


def test_auto_recipe_is_the_first_of_its_kind_not_the_last_added(monkeypatch):
    """A recipe added to RECIPES with the kind of a paper's algorithm used to replace that
    algorithm for every config with ``recipe: auto``."""
    from graded.config import sections
    from graded.train.recipes import RECIPES, Recipe

    monkeypatch.setitem(RECIPES, "lgt-mine", Recipe(name="lgt-mine", kind="linear"))
    monkeypatch.setitem(RECIPES, "egt-mine", Recipe(name="egt-mine", kind="exponential"))
    cfg = sections.RunConfig.model_validate(
        {"task": {"name": "modular"}, "model": {"grading": "linear"}})
    assert sections.RECIPE_OBJECTS is RECIPES and cfg.recipe_name() == "lgt-alg5.1"
    cfg = sections.RunConfig.model_validate(
        {"task": {"name": "modular"}, "model": {"grading": "exponential"}})
    assert cfg.recipe_name() == "egt-alg7.1"


def test_a_recipe_whose_key_and_name_disagree_is_refused_naming_both(monkeypatch):
    from graded.train.recipes import RECIPES, Recipe, get_recipe

    monkeypatch.setitem(RECIPES, "mine", Recipe(name="lgt-alg5.1", kind="linear"))
    with pytest.raises(ValueError, match=r"recipe 'mine' in RECIPES is a Recipe named "
                                         r"'lgt-alg5.1'"):
        get_recipe("mine")


def test_a_new_program_search_problem_registers_once_by_name(monkeypatch):
    """docs/program_search.md: register_problem names a problem for get_problem and the CLI;
    a name taken by another factory, a shipped one's included, is refused naming it."""
    from graded.search.program import available_problems, get_problem, register_problem
    from graded.search.program import problem as registry

    available_problems()  # the shipped problems, before the registry is copied
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    seen = {}

    def small_cap_set(**options):
        seen.update(options)
        return get_problem("cap-set", n=2)

    register_problem("small-cap-set", small_cap_set)
    register_problem("small-cap-set", small_cap_set)  # its module imported again
    assert "small-cap-set" in available_problems()
    assert get_problem("small-cap-set", colour="red") is not None
    assert seen == {"colour": "red"}
    with pytest.raises(ValueError, match=r"problem 'small-cap-set' is already registered to "
                                         r"<function .*small_cap_set"):
        register_problem("small-cap-set", lambda **o: get_problem("cap-set", n=2))
    with pytest.raises(ValueError, match=r"problem 'cap-set' is already registered"):
        register_problem("cap-set", small_cap_set)
    with pytest.raises(ValueError, match=r"register_problem needs a name and a callable, "
                                         r"got 3"):
        register_problem(3, small_cap_set)


@pytest.mark.slow  # a process or a whole run of tens of seconds: `pytest -m slow`
def test_a_new_morphic_block_is_an_options_model_with_build(tmp_path):
    """docs/cli.md: a block kind is one entry of BLOCK_OPTIONS, its options model's ``build``
    making the block of an edge (here a linear map scaled by a fixed factor). The morphic
    layers are not listed by ``graded train --help``: the refusal of a bad block names it."""
    _run_edited(
        tmp_path, "morphic/config.py",
        [('# The block kinds a layer spec names, each with its options.\n',
          'class ScaledBlockOptions(BlockOptions):\n'
          '    factor: float = 0.5\n\n'
          '    def build(self, d_in, d_out):\n'
          '        block = LinearBlock(d_in, d_out)\n'
          '        block.register_forward_hook(lambda m, i, out: out * self.factor)\n'
          '        block.scaled_by = self.factor\n'
          '        return block\n\n\n'
          '# The block kinds a layer spec names, each with its options.\n'),
         ('"attention": AttentionBlockOptions,\n}',
          '"attention": AttentionBlockOptions,\n    "scaled": ScaledBlockOptions,\n}')],
        task={"name": "dyck", "options": {"k": 1, "max_length": 8, "max_depth": 2},
              "n_train": 16, "n_eval": 8},
        model={"architecture": "morphic", "morphic": {
            "grades": [{"label": "g0", "dim": 8, "index": 0},
                       {"label": "g1", "dim": 8, "index": 1}],
            "layers": [{"banded": [0, 1], "block": "scaled",
                        "block_options": {"factor": 0.25}, "router": {"rank": 2}}]}},
        recipe="plain", listed="",
        check="""
blocks = [m for m in parts.model.modules() if hasattr(m, "scaled_by")]
assert blocks and all(m.scaled_by == 0.25 for m in blocks)
from graded.config import ConfigError
data["model"]["morphic"]["layers"][0]["block"] = "nope"
try:
    validate_config(data)
except ConfigError as exc:
    assert "'scaled'" in str(exc), str(exc)
else:
    raise AssertionError("block 'nope' was accepted")
""")
