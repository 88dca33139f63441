"""Run configs: files, overrides, and errors that name the key, the value and what is allowed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from graded.config import ConfigError, apply_overrides, load_config, validate_config

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
SHIPPED = sorted((Path(__file__).parents[1] / "configs").glob("*.[yt]*ml"))  # TOML too
BASE = {
    "task": {"name": "polynomial_regression", "n_train": 64, "n_eval": 32},
    "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "grading": "linear",
              "learnable_grades": True},
    "train": {"steps": 10, "batch_size": 16},
}


def _write(tmp_path, data, name="run.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    assert cfg.task.name
    assert cfg.recipe_name() in ("plain", "lgt-alg5.1", "egt-alg7.1")


def test_shipped_configs_cover_every_task():
    from graded.tasks import available_tasks

    covered = {load_config(p).task.name for p in CONFIGS}
    assert covered >= set(available_tasks())


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_configs_train_on_the_loss_their_recipe_states(path, tmp_path):
    """A shipped config runs without the warning that its graded recipe falls back to the
    plain loss: where the task's targets carry no grades it asks for the plain loss
    (``recipe.options.graded_loss: false``), as the demo's runs do."""
    from graded.config import build_run

    small = ["task.n_train=64", "task.n_eval=32"]
    cfg = load_config(path, [] if load_config(path).task.name == "modular" else small)
    trainer = build_run(cfg, tmp_path / "run").trainer
    assert trainer.plain_loss_note is None, trainer.plain_loss_note


def _suggested_overrides() -> list[tuple[str, list[str]]]:
    """The ``--set`` lines a shipped config's header comment suggests (an ungraded twin, an
    LGT, another split or target), one list of overrides per comment line."""
    found = []
    for path in SHIPPED:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("#") and "--set " in line:
                found.append((path.name, re.findall(r"--set (\S+)", line)))
    return found


@pytest.mark.parametrize(("name", "overrides"), _suggested_overrides(),
                         ids=[f"{n}:{' '.join(o)}" for n, o in _suggested_overrides()])
def test_the_overrides_a_shipped_config_suggests_run_as_suggested(name, overrides, tmp_path):
    """Following a config's comment (``--set model.grading=null`` for the ungraded twin, ...)
    gives a valid run, and not one whose recipe warns that it falls back to the plain loss."""
    from graded.config import build_run

    path = Path(__file__).parents[1] / "configs" / name
    cfg = load_config(path, ["task.n_train=64", "task.n_eval=32", *overrides])
    trainer = build_run(cfg, tmp_path / "run").trainer
    assert trainer.plain_loss_note is None, trainer.plain_loss_note


def test_the_run_config_docs_cli_md_shows_runs_on_the_loss_its_recipe_states(tmp_path):
    """docs/cli.md's example run config (an LGT on dyck_recognition) validates and does not
    warn that its graded recipe falls back to the plain loss."""
    from graded.config import build_run

    text = (Path(__file__).parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")
    path = tmp_path / "example.yaml"
    path.write_text(re.search(r"```yaml\n(.*?)```", text, re.S).group(1))
    cfg = load_config(path, ["task.n_train=64", "task.n_eval=32"])
    assert cfg.recipe_name() == "lgt-alg5.1"
    assert build_run(cfg, tmp_path / "run").trainer.plain_loss_note is None


def test_data_sizes_a_task_cannot_draw_name_the_config_keys(tmp_path):
    """The task's message speaks of n_test; the error also names task.n_train and
    task.n_eval, the keys to change (modular addition mod 5 has 25 pairs)."""
    from graded.config import build_data

    data = {"task": {"name": "modular", "options": {"p": 5}, "n_train": 20, "n_eval": 10},
            "model": {"d_model": 16, "n_heads": 2, "n_layers": 1}, "train": {"steps": 2}}
    cfg = load_config(_write(tmp_path, data))
    with pytest.raises(ConfigError, match=r"task 'modular' cannot draw its data with "
                       r"task.split='random', task.n_train=20, task.n_eval=10 \(n_test below\): "
                       r"n_train \+ n_test = 30 exceeds the 25"):
        build_data(cfg, cfg.built_task)


def test_yaml_and_toml_files_give_the_same_config(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(
        '[task]\nname = "polynomial_regression"\nn_train = 64\nn_eval = 32\n'
        '[model]\nd_model = 16\nn_heads = 2\nn_layers = 1\ngrading = "linear"\n'
        'learnable_grades = true\n[train]\nsteps = 10\nbatch_size = 16\n'
    )
    assert load_config(toml) == load_config(_write(tmp_path, BASE))


def test_typo_in_a_key_names_it_and_suggests_the_right_one(tmp_path):
    data = {**BASE, "train": {"steps": 10, "batch_sise": 16}}
    with pytest.raises(ConfigError, match=r"train\.batch_sise: unknown key \(did you mean "
                                          r"'batch_size'\?\); allowed keys: .*batch_size"):
        load_config(_write(tmp_path, data))


def test_typo_in_a_model_key_is_rejected(tmp_path):
    data = {**BASE, "model": {"d_modle": 16}}
    with pytest.raises(ConfigError, match=r"model\.d_modle: unknown key \(did you mean "
                                          r"'d_model'\?\)"):
        load_config(_write(tmp_path, data))


@pytest.mark.parametrize(
    "override, pattern",
    [
        ("train.lr=-1", r"train\.lr: got -1; Input should be greater than 0"),
        ("train.schedule=linear", r"train\.schedule: got 'linear'; Input should be 'constant'"),
        ("task.split=bysize", r"task\.split: got 'bysize'"),
        ("model.n_heads=3", r"TransformerConfig\.d_model=16 is invalid: expected a multiple of "
                            r"n_heads=3"),
        ("model.positional=abs", r"positional='abs' is invalid: expected one of"),
        ("task.name=nope", r"task\.name: unknown task 'nope'; available tasks"),
        ("task.options.degre=2", r"task\.options: unknown option\(s\) \['degre'\]"),
        ("recipe=egt-alg7.1", r"recipe: 'egt-alg7.1' needs model.grading=exponential, "
                              r"got 'linear'"),
        ("recipe.options.gama=1", r"recipe\.options: unknown option\(s\) \['gama'\]"),
        ("train.warmup_steps=50", r"warmup_steps \(50\) must be smaller than steps \(10\); "
                                  r"lower train\.warmup_steps or raise train\.steps"),
        ("train.device=cpu:5", r"train\.device: device 'cpu:5' is not supported: expected "
                               r"'auto', 'cpu', 'cuda' or 'cuda:N'"),
        ("train.device=mps", r"train\.device: device 'mps' is not supported"),
        ("model.vocab_size=3", r"model\.vocab_size is set by the task"),
        ("train.lr=inf", r"train\.lr: got 'inf'; Input should be a finite number"),
        ("train.weight_decay=.inf", r"train\.weight_decay: got inf; Input should be a finite"),
        ("train.early_stopping.min_delta=.inf",
         r"train\.early_stopping\.min_delta: got inf; Input should be a finite number"),
        # YAML booleans given for numbers (lax validation read `true` as 1 step, or lr 1.0)
        ("train.steps=true", r"train\.steps: got True; expected a number, not a boolean"),
        ("train.lr=on", r"train\.lr: got True; expected a number, not a boolean"),
        ("train.early_stopping.patience=yes",
         r"train\.early_stopping\.patience: got True; expected a number, not a boolean"),
        ("task.n_train=true", r"task\.n_train: got True; expected a number, not a boolean"),
        ("seed=false", r"seed: got False; expected a number, not a boolean"),
    ],
)
def test_bad_value_is_rejected_naming_key_value_and_allowed(tmp_path, override, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(_write(tmp_path, BASE), [override])


def test_a_recipe_option_the_recipe_does_not_use_is_refused_on_one_line(tmp_path):
    """`--set recipe.name=plain --set recipe.options.gamma=0.1 --set model.grading=null`
    trained without a word: the plain recipe has no grade regulariser."""
    overrides = ["recipe.name=plain", "recipe.options.gamma=0.1", "model.grading=null"]
    with pytest.raises(ConfigError) as exc:
        load_config(_write(tmp_path, BASE), overrides)
    assert str(exc.value).splitlines()[1:] == [
        "  recipe.options: recipe 'plain' does not use gamma=0.1, which would have no effect; "
        "its options are ['clip_norm']"]
    with pytest.raises(ConfigError, match=r"recipe\.options: recipe 'lgt-alg5\.1' does not use "
                                          r"anneal=False"):
        load_config(_write(tmp_path, BASE), ["recipe.options.anneal=false"])  # auto: LGT
    ok = load_config(_write(tmp_path, BASE), ["recipe.options.gamma=0.1"])
    assert ok.built_recipe.name == "lgt-alg5.1" and ok.built_recipe.gamma == 0.1


def test_overrides_follow_yaml_scalar_rules():
    data = apply_overrides({"train": {"lr": 1.0}}, [
        "train.lr=3e-4", "train.clip_norm=null", "train.progress=false", "name=run 7",
        "task.options.degree=2",
    ])
    assert data["train"] == {"lr": 3e-4, "clip_norm": None, "progress": False}
    assert data["name"] == "run 7" and data["task"] == {"options": {"degree": 2}}


def test_a_key_set_inside_a_section_that_is_off_turns_the_section_on(tmp_path):
    # every config.yaml without early stopping reads `early_stopping: null`; a resume that
    # turns it on sets a key inside it
    data = apply_overrides({"train": {"early_stopping": None}},
                           ["train.early_stopping.patience=3"])
    assert data == {"train": {"early_stopping": {"patience": 3}}}
    base = {**BASE, "train": {**BASE["train"], "early_stopping": None}}
    cfg = load_config(_write(tmp_path, base), ["train.early_stopping.patience=3"])
    assert cfg.train.early_stopping.model_dump() == {"patience": 3, "min_delta": 0.0}


def test_an_item_of_a_list_is_set_by_its_index_and_a_bad_index_names_the_list():
    layers = [{"block": "linear", "router": {"rank": 8}}, {"block": "ffn"}]
    data = {"model": {"morphic": {"layers": layers}}, "train": {"betas": [0.9, 0.98]}}
    out = apply_overrides(data, ["model.morphic.layers.1.block=attention",
                                 "model.morphic.layers.0.router.rank=4", "train.betas.1=0.95"])
    assert out == {"model": {"morphic": {"layers": [
        {"block": "linear", "router": {"rank": 4}}, {"block": "attention"}]}},
        "train": {"betas": [0.9, 0.95]}}
    assert data["model"]["morphic"]["layers"] == layers  # the input is left alone
    for bad in ("2", "-1", "first"):
        with pytest.raises(ConfigError, match=re.escape(
                f"model.morphic.layers is a list of 2 item(s); expected an index 0 to 1, "
                f"got '{bad}'")):
            apply_overrides(data, [f"model.morphic.layers.{bad}.block=ffn"])


@pytest.mark.parametrize("bad", ["train.lr", "=3", "train.lr.x=1"])
def test_malformed_override_is_rejected(bad):
    with pytest.raises(ConfigError, match="--set"):
        apply_overrides({"train": {"lr": 1.0}}, [bad])


def test_recipe_auto_follows_the_model_grading():
    for grading, recipe in [(None, "plain"), ("linear", "lgt-alg5.1"),
                            ("exponential", "egt-alg7.1")]:
        cfg = validate_config({**BASE, "model": {**BASE["model"], "grading": grading}})
        assert cfg.recipe_name() == recipe


def test_a_key_given_twice_in_a_yaml_file_is_refused_in_one_line(tmp_path):
    # YAML keeps the last of two equal keys: a second `train:` section silently replaced the
    # first, so these steps and lr were dropped for the defaults
    path = tmp_path / "run.yaml"
    path.write_text("task: {name: polynomial_regression}\ntrain:\n  steps: 3\n  lr: 1.0e-2\n"
                    "train:\n  batch_size: 8\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == (f"config file {path} does not parse: the key 'train' is given "
                              "twice (the second would silently replace the first) (line 5, "
                              "column 1)")
    path.write_text("task: {name: polynomial_regression}\ntrain: {steps: 3, steps: 4}\n")
    with pytest.raises(ConfigError, match=r"the key 'steps' is given twice .*\(line 2, "):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^--set 'task.options=\{k: 1, k: 2\}': value does "
                                          r"not parse: the key 'k' is given twice"):
        apply_overrides({}, ["task.options={k: 1, k: 2}"])
    # the same key in different mappings is fine, and so is a key beside a merge that
    # overrides a merged one (YAML's `<<`)
    path.write_text("task: {name: polynomial_regression, options: &o {degree: 2}}\n"
                    "train: {steps: 3}\nmodel: {d_model: 16, n_heads: 2}\n")
    assert load_config(path).task.options == {"degree": 2}
    assert apply_overrides({}, ["train={<<: {steps: 3, lr: 0.1}, lr: 0.2}"]) == {
        "train": {"steps": 3, "lr": 0.2}}


def test_missing_file_and_wrong_suffix_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"expected a \.yaml, \.yml or \.toml file"):
        load_config(tmp_path / "run.json")


def test_input_grades_task_starts_the_input_grading_at_the_natural_grades():
    from graded.config import build_model, build_task

    cfg = validate_config({
        "task": {"name": "weighted_projective"},
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "grading": "exponential",
                  "learnable_grades": True, "input_grades": "task"},
    })
    model = build_model(cfg, build_task(cfg))
    assert model.input_grading.grades.tolist() == [2.0, 4.0, 6.0, 10.0]  # J2, J4, J6, J10


def test_input_grades_task_is_rejected_for_token_tasks(tmp_path):
    data = {**BASE, "task": {"name": "dyck"},
            "model": {**BASE["model"], "input_grades": "task"}}
    with pytest.raises(ConfigError, match="input_grades='task' needs a task with graded input "
                                          "features; task 'dyck' grades 'tokens'"):
        validate_config(data)


def test_size_split_model_covers_the_longer_test_objects():
    from graded.config import build_task, transformer_config

    cfg = validate_config({"task": {"name": "dyck_recognition", "split": "size"},
                           "model": {"d_model": 16, "n_heads": 2}})
    task = build_task(cfg)
    small, large = task.size_configs()
    assert large.max_len > small.max_len
    assert transformer_config(cfg, task).max_len == max(task.max_len, large.max_len)


def test_split_the_task_cannot_make_is_rejected_before_training():
    with pytest.raises(ConfigError, match=r"task\.split: a size split is not meaningful for task "
                                          "'modular'"):
        validate_config({"task": {"name": "modular", "split": "size"}})


def test_the_schema_offers_exactly_the_split_kinds_of_the_tasks():
    from typing import get_args

    from graded.config import TaskSection
    from graded.tasks.base import SPLIT_KINDS

    assert get_args(TaskSection.model_fields["split"].annotation) == SPLIT_KINDS


def test_family_split_is_checked_before_training():
    with pytest.raises(ConfigError, match=r"task\.split: a family split is not meaningful for "
                                          "task 'dyck'"):
        validate_config({"task": {"name": "dyck", "split": "family"}})
    options = {"graph_families": ["tree", "cycle"], "test_families": ["grid"]}
    with pytest.raises(ConfigError, match=r"task\.split: test_families \['grid'\] are not among"):
        validate_config({"task": {"name": "graph_properties", "split": "family",
                                  "options": options}})


# --------------------------------------------------------------------------- one typed system


def test_validation_builds_the_task_model_config_and_recipe_the_run_uses(tmp_path):
    from graded.config import build_run
    from graded.train.recipes import get_recipe
    from graded.transformer.config import TransformerConfig

    cfg = validate_config({**BASE, "output": {"dir": str(tmp_path)}})
    assert cfg.built_task.name == "polynomial_regression"
    assert cfg.built_recipe == get_recipe("lgt-alg5.1")
    assert isinstance(cfg.built_model_config, TransformerConfig)
    parts = build_run(cfg)
    assert parts.task is cfg.built_task
    assert parts.recipe is cfg.built_recipe and parts.trainer.recipe is cfg.built_recipe
    assert parts.model.config == cfg.built_model_config


def test_a_run_config_built_by_hand_is_dry_built_when_run(tmp_path):
    from graded.config import RunConfig, build_run

    cfg = RunConfig.model_validate({**BASE, "output": {"dir": str(tmp_path)}})
    assert cfg.built_task is None
    parts = build_run(cfg)
    assert parts.task is cfg.built_task is not None


def test_a_recipe_for_another_grading_stays_an_error_for_every_graded_recipe():
    from graded.train.recipes import RECIPES

    for name, recipe in RECIPES.items():
        if recipe.kind is None:
            continue
        other = {"linear": "exponential", "exponential": "linear"}[recipe.kind]
        data = {**BASE, "model": {**BASE["model"], "grading": other}, "recipe": name}
        with pytest.raises(ConfigError, match=f"needs model.grading={recipe.kind}"):
            validate_config(data)


def test_auto_recipe_is_the_recipe_whose_kind_is_the_grading():
    from graded.train.recipes import RECIPES

    for name, recipe in RECIPES.items():
        if recipe.kind is not None:
            cfg = validate_config({**BASE, "model": {**BASE["model"], "grading": recipe.kind}})
            assert cfg.recipe_name() == name


def test_schema_choices_are_the_constants_of_the_owning_modules():
    from typing import get_args

    from graded.attention.graded import VARIANTS
    from graded.attention.scores import SCORES
    from graded.config import RecipeSection, RunConfig, TaskSection, describe_schema
    from graded.config.schema import ModelSection
    from graded.grading import GRADINGS, LINEAR_FUNCTIONS
    from graded.kinds import ARCHITECTURES
    from graded.positional import POSITIONAL
    from graded.tasks.base import SPLIT_KINDS
    from graded.train.recipes import RECIPES
    from graded.transformer.config import TransformerConfig
    from graded.transformer.layers import ACTIVATIONS, NORMS

    def literal(model, name):
        ann = model.model_fields[name].annotation
        return tuple(a for a in get_args(ann) if a is not type(None))

    def choices(ann):  # Literal[...] or Literal[...] | None
        inner = [a for a in get_args(ann) if a is not type(None)]
        return get_args(inner[0]) if len(inner) == 1 and get_args(inner[0]) else tuple(inner)

    assert literal(RecipeSection, "name") == ("auto", *RECIPES)
    assert literal(TaskSection, "split") == SPLIT_KINDS
    assert literal(ModelSection, "architecture") == ARCHITECTURES
    fields = TransformerConfig.model_fields
    for name, owner in [("positional", POSITIONAL), ("activation", ACTIVATIONS), ("norm", NORMS),
                        ("attn_score", SCORES), ("grade_attention_variant", VARIANTS),
                        ("grading_f", LINEAR_FUNCTIONS)]:
        assert literal(TransformerConfig, name) == owner, name
    assert choices(fields["grading"].annotation) == GRADINGS
    assert f"one of {', '.join(('auto', *RECIPES))}" in describe_schema()
    assert RunConfig.model_fields["recipe"].annotation is RecipeSection


def test_train_help_lists_every_model_key_with_its_default_and_choices():
    """`graded train --help` lists the TransformerConfig fields a config may set (not only
    "any TransformerConfig field"), and a default that follows another key says so."""
    from graded.attention.backends import available_backends
    from graded.config import describe_schema
    from graded.config.schema import TASK_DERIVED
    from graded.transformer.config import TransformerConfig
    from graded.transformer.graded import GRADE_INITS

    text = describe_schema()
    lines = {line.strip().split(" ", 1)[0]: line.strip() for line in text.splitlines()}
    for key in set(TransformerConfig.model_fields) - set(TASK_DERIVED):
        assert key in lines, key
    for key in TASK_DERIVED:
        assert key not in lines, key
    assert lines["d_model"] == f"d_model (default {TransformerConfig().d_model!r})"
    assert lines["grading"] == "grading (default None; one of linear, exponential, null)"
    assert lines["grade_init"].endswith(f"one of {', '.join(GRADE_INITS)})")
    assert lines["attn_backend"].endswith(f"one of {', '.join(available_backends())})")
    assert lines["token_grade_stages"].startswith(
        "token_grade_stages (default ['input', 'ffn', 'output']; each one of input, ffn, output")
    assert "PydanticUndefined" not in text
    assert lines["monitor_mode"].startswith("monitor_mode (default follows monitor; one of "
                                            "min, max)")


def test_registry_choices_are_read_from_the_registry_when_validating():
    from graded.attention.backends import available_backends
    from graded.transformer.config import TransformerConfig
    from graded.transformer.graded import GRADE_INITS

    # the options a backend needs (no default): the config builds the backend to check them
    needed = {"block_sparse": {"layout": [[True]]}, "linformer": {"max_len": 8}}
    for backend in available_backends():
        assert TransformerConfig(attn_backend=backend,
                                 attn_backend_options=needed.get(backend, {})
                                 ).attn_backend == backend
    for init in GRADE_INITS:
        assert TransformerConfig(grading="linear", grade_init=init).grade_init == init
    with pytest.raises(ValueError, match=r"grade_init='warm' is invalid: expected one of "
                                         + re.escape(str(GRADE_INITS))):
        TransformerConfig(grade_init="warm")
    with pytest.raises(ValueError, match=r"attn_backend='flash9' is invalid: expected one of"):
        TransformerConfig(attn_backend="flash9")


def test_load_run_config_reads_a_run_folder_through_the_schema(tmp_path):
    from graded.config import dump_config, load_run_config

    cfg = validate_config({**BASE, "name": "r", "output": {"dir": str(tmp_path)}})
    cfg.run_dir().mkdir(parents=True)
    (cfg.run_dir() / "config.yaml").write_text(dump_config(cfg))
    again = load_run_config(cfg.run_dir())
    assert again == cfg and again.built_model_config == cfg.built_model_config
    with pytest.raises(ConfigError, match=r"has no config\.yaml"):
        load_run_config(tmp_path)
    (tmp_path / "config.yaml").write_text("task: {name: dyck}\nmodel: {d_modle: 8}\n")
    with pytest.raises(ConfigError, match=r"model\.d_modle: unknown key"):
        load_run_config(tmp_path)


@pytest.mark.parametrize("name", ["", " ", ".", "..", "../beside", "a/b", "/tmp/elsewhere",
                                  "a\\b"])
def test_a_run_name_that_is_not_one_folder_name_is_rejected_naming_it(name):
    # the run folder is output.dir/name: these would put it in output.dir itself, beside it,
    # below another run's folder or anywhere on the disk
    with pytest.raises(ConfigError, match=rf"name: got {re.escape(repr(name))}; expected a "
                                          r"folder name"):
        validate_config({**BASE, "name": name})


def test_a_run_name_stays_inside_output_dir(tmp_path):
    cfg = load_config(_write(tmp_path, {**BASE, "output": {"dir": str(tmp_path / "runs")}}),
                      ["name=lr3e-4 seed 1"])
    assert cfg.run_dir().parent == tmp_path / "runs"
    assert cfg.run_dir().name == "lr3e-4 seed 1"


@pytest.mark.parametrize(("monitor", "mode"), [("loss", "min"), ("mse", "min"), ("mae", "min"),
                                               ("r2", "max"), ("perplexity", "min"),
                                               ("accuracy", "max"), ("exact_match", "max")])
def test_monitor_mode_left_out_follows_the_monitor_and_a_given_one_is_kept(tmp_path, monitor,
                                                                         mode):
    assert load_config(_write(tmp_path, BASE), [f"train.monitor={monitor}"]
                       ).train.monitor_mode == mode
    other = {"min": "max", "max": "min"}[mode]
    assert load_config(_write(tmp_path, BASE), [f"train.monitor={monitor}",
                                                f"train.monitor_mode={other}"]
                       ).train.monitor_mode == other


def test_keys_the_run_would_ignore_are_refused_naming_key_and_value(tmp_path):
    # pooling: an LM (or seq2seq) model pools nothing, so 'first' would silently act as 'mean'
    lm = {**BASE, "task": {"name": "dyck", "n_train": 64, "n_eval": 32},
          "model": {"d_model": 16, "n_heads": 2, "n_layers": 1}}
    with pytest.raises(ConfigError, match=r"model\.pooling: got 'first'; .* task 'dyck' is "
                                          r"'lm': expected the default 'mean'"):
        load_config(_write(tmp_path, lm), ["model.pooling=first"])
    load_config(_write(tmp_path, lm), ["model.pooling=mean"])  # the default, as recorded
    built = load_config(_write(tmp_path, BASE), ["model.pooling=first"])  # an encoder pools
    assert built.model.pooling == "first"
    # min_lr_ratio is the cosine schedule's floor: the other schedules have none
    for schedule in ("constant", "inverse_sqrt"):
        with pytest.raises(ConfigError, match=rf"min_lr_ratio \(0\.5\) is the floor of the "
                                              rf"cosine schedule; schedule '{schedule}'"):
            load_config(_write(tmp_path, BASE), [f"train.schedule={schedule}",
                                                 "train.min_lr_ratio=0.5"])
    cfg = load_config(_write(tmp_path, BASE), ["train.min_lr_ratio=0.5"])  # cosine: used
    assert cfg.train.schedule == "cosine" and cfg.train.min_lr_ratio == 0.5


def test_a_seed_beyond_64_bits_is_refused_naming_the_key_and_the_largest_runs(tmp_path):
    # torch.manual_seed takes at most 64 bits: a larger seed used to pass validation and fail
    # later with "Overflow when unpacking long long", naming neither key nor value
    import torch

    from graded.config import build_data, build_task

    for key in ("seed", "task.data_seed"):
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}: got {2**64}; Input should "
                                              rf"be less than {2**64}"):
            load_config(_write(tmp_path, BASE), [f"{key}={2**64}"])
    cfg = load_config(_write(tmp_path, BASE), [f"seed={2**64 - 1}"])
    train, _ = build_data(cfg, build_task(cfg))  # the largest seed draws its split
    torch.manual_seed(cfg.seed)
    assert len(train) == BASE["task"]["n_train"]


def test_a_fixed_length_list_given_too_few_values_names_the_key_and_the_values():
    """pydantic reports the missing second beta at ``train.betas.1`` as a "required key"; the
    message names the list and what it got."""
    with pytest.raises(ConfigError, match=r"train.betas: got \[0.9\]; expected more values "
                       r"\(no value at position 1\)"):
        validate_config({"task": {"name": "dyck"}, "train": {"betas": [0.9]}})


def test_a_grade_learning_rate_for_a_model_without_grades_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"train.grade_lr: got 0.1; the model has no grades"):
        validate_config({"task": {"name": "dyck"}, "model": {"grading": None},
                          "train": {"grade_lr": 0.1}})
    graded = validate_config({"task": {"name": "dyck"}, "model": {"grading": "linear"},
                               "train": {"grade_lr": 0.1}})
    assert graded.train.grade_lr == 0.1


def test_the_recipes_clip_norm_is_refused_in_a_run_naming_train_clip_norm():
    """A run clips at ``train.clip_norm``; the recipe's ``clip_norm`` (the default of loops
    written by hand) would be ignored, so a run config refuses it, even set off."""
    base = {"task": {"name": "dyck"}, "model": {"grading": "linear"}}
    for value in (2.0, None):
        with pytest.raises(ConfigError, match=r"recipe.options.clip_norm: got .*; a run clips "
                           r"gradients at train.clip_norm"):
            validate_config({**base, "recipe": {"name": "auto", "options": {"clip_norm": value}}})
    assert validate_config({**base, "train": {"clip_norm": 2.0}}).train.clip_norm == 2.0


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_every_device_name_the_error_lists_is_accepted(device):
    from graded.train.options import TrainOptions

    assert TrainOptions(steps=10, device=device).device == device


@pytest.mark.parametrize(("stored", "read"), [("cpu:5", "cpu"), ("mps", "auto")])
def test_a_run_recorded_with_a_device_this_version_refuses_is_read_with_a_warning(
        tmp_path, capsys, stored, read):
    """Earlier versions took ``train.device: cpu:5`` (torch ignores a CPU index); a run folder
    recording it is read by eval, generate and report, which do not train on it: ``cpu:N`` as
    ``cpu``, any other refused value as the default, with a warning naming the value. A new
    config is still refused it."""
    from graded.config import dump_config, load_run_config

    cfg = validate_config({**BASE, "name": "r", "output": {"dir": str(tmp_path)}})
    cfg.run_dir().mkdir(parents=True)
    recorded = yaml.safe_load(dump_config(cfg))
    recorded["train"]["device"] = stored
    (cfg.run_dir() / "config.yaml").write_text(yaml.safe_dump(recorded, sort_keys=False))
    capsys.readouterr()
    again = load_run_config(cfg.run_dir())
    assert again.train.device == read
    assert again.model_dump(exclude={"train"}) == cfg.model_dump(exclude={"train"})
    err = capsys.readouterr().err
    assert f"train.device={stored!r}" in err and "config.yaml" in err
    with pytest.raises(ConfigError, match=rf"train\.device: .*{stored!r} is not supported"):
        load_config(cfg.run_dir() / "config.yaml")
    # a device this version takes is read as recorded, without a word
    recorded["train"]["device"] = "cuda:1"
    (cfg.run_dir() / "config.yaml").write_text(yaml.safe_dump(recorded, sort_keys=False))
    assert load_run_config(cfg.run_dir()).train.device == "cuda:1"
    assert capsys.readouterr().err == ""


# (task, kind, field, a value other than its default) for each field a kind's model leaves unread
UNREAD = [
    ("dyck", "lm", "n_decoder_layers", 3),
    ("dyck", "lm", "cross_attn_backend", "chunked"),
    ("dyck", "lm", "cross_attn_backend_options", {"scale": 0.5}),
    ("listops", "classification", "n_decoder_layers", 3),
    ("listops", "classification", "cross_attn_backend", "chunked"),
    ("listops", "classification", "cross_attn_backend_options", {"scale": 0.5}),
    ("listops", "classification", "tie_embeddings", False),
    ("listops", "classification", "logit_bias", True),
    ("polynomial_regression", "regression", "tie_embeddings", False),
    ("polynomial_regression", "regression", "logit_bias", True),
    ("polynomial_regression", "regression", "n_decoder_layers", 2),
]


@pytest.mark.parametrize(("task", "kind", "field", "value"), UNREAD,
                         ids=[f"{k}-{f}" for _, k, f, _ in UNREAD])
def test_a_model_field_the_kinds_model_does_not_read_is_refused_naming_field_and_kind(
        task, kind, field, value):
    """``n_decoder_layers`` of an LM, ``tie_embeddings`` of a classifier, ...: each was taken
    and changed nothing. Refused away from its default, naming the field, the task's kind and
    why; the default stays accepted, and the seq2seq model, which reads them, takes them."""
    from graded.transformer.config import TransformerConfig

    base = {"task": {"name": task, "n_train": 64, "n_eval": 32}}
    with pytest.raises(ConfigError, match=rf"model\.{field}: got {re.escape(repr(value))}; task "
                                          rf"'{task}' is '{kind}', whose model \(\w+\) does not "
                                          r"read it: .*; expected the default"):
        validate_config({**base, "model": {field: value}})
    default = TransformerConfig.model_fields[field].get_default(call_default_factory=True)
    validate_config({**base, "model": {field: default}})
    seq2seq = validate_config({"task": {"name": "polynomials_seq2seq"},
                               "model": {field: value}})
    assert getattr(seq2seq.built_model_config, field) == value


@pytest.mark.parametrize(("task", "kind", "field", "value"), UNREAD,
                         ids=[f"{k}-{f}" for _, k, f, _ in UNREAD])
def test_the_fields_a_kinds_model_is_said_not_to_read_change_nothing_in_it(task, kind, field,
                                                                           value):
    """The independent side of the refusal above: the model the kind builds with the field at
    its default and with the other value, from one seed, has the same parameters and
    outputs."""
    import torch

    from graded.config import build_data, build_task
    from graded.kinds import get_kind
    from graded.transformer.models import unread_fields

    cfg = validate_config({"task": {"name": task, "n_train": 16, "n_eval": 8},
                           "model": {"d_model": 16, "n_heads": 2, "n_layers": 1}})
    task_obj = build_task(cfg)
    train, _ = build_data(cfg, task_obj)
    model_class = get_kind(task_obj.kind).model_class()
    changed = cfg.built_model_config.replace(**{field: value})
    assert [f for f, *_ in unread_fields(model_class, changed)] == [field]
    outputs = []
    for config in (cfg.built_model_config, changed):
        torch.manual_seed(0)
        model = get_kind(task_obj.kind).build_model(config, task_obj).eval()
        outputs.append((model.state_dict(), get_kind(task_obj.kind).forward(model, train.tensors)))
    (first, out_first), (second, out_second) = outputs
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert torch.equal(out_first, out_second)


@pytest.mark.parametrize("suffix", [".yaml", ".toml"])
def test_a_config_file_that_is_not_utf8_is_refused_naming_the_file_and_the_byte(tmp_path,
                                                                              suffix):
    """A Latin-1 file gave "'utf-8' codec can't decode byte 0xe9 in position 24", naming no
    file."""
    path = tmp_path / f"run{suffix}"
    path.write_bytes("# run config\nname = 'caf\u00e9'\n".encode("latin-1"))
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == (f"config file {path} is not UTF-8 text: byte 0xe9 at line 2 "
                              "(position 24); save it as UTF-8")


def test_an_empty_config_file_is_refused_as_empty(tmp_path):
    """It said "expected a mapping at the top, got None"."""
    path = tmp_path / "run.yaml"
    path.write_text("# nothing yet\n\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert str(exc.value) == (f"config file {path} is empty; expected a run config (task:, "
                              "model:, train:, ...)")


def test_the_output_folder_reads_a_leading_tilde_as_the_home_folder(tmp_path, monkeypatch):
    """``dir: ~/runs`` (a config file is not read by a shell) made a folder named ``~`` in the
    current folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = validate_config({**BASE, "output": {"dir": "~/runs"}})
    assert cfg.output.dir == tmp_path / "home" / "runs"
    assert cfg.run_dir().parent == tmp_path / "home" / "runs"
    assert validate_config({**BASE, "output": {"dir": "a~b"}}).output.dir == Path("a~b")
