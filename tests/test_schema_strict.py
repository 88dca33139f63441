"""graded._schema: every config field takes a value of its own type, and the error names the
owner, the field and the value (pydantic's lax mode read 1 and "yes" as True, True as 1, and
took NaN and inf for numbers)."""

import math
from typing import Annotated, Literal

import pytest

from graded._schema import ConfigModel, Strict, choice
from graded.config import load_config
from graded.morphic.config import RouterOptions
from graded.search.patternboost.config import PatternBoostConfig


class Example(ConfigModel):
    switch: bool = True
    maybe: bool | None = None
    count: int = 1
    scale: float = 1.0
    limit: float | None = None


@pytest.mark.parametrize("field, value, expected", [
    ("switch", 1, "Example.switch=1 is invalid: expected True or False"),
    ("switch", "yes", "Example.switch='yes' is invalid: expected True or False"),
    ("switch", None, "Example.switch=None is invalid: expected True or False"),
    ("maybe", 0, "Example.maybe=0 is invalid: expected None or True or False"),
    ("count", True, "Example.count=True is invalid: expected a number, not a boolean"),
    ("scale", False, "Example.scale=False is invalid: expected a number, not a boolean"),
    ("limit", True, "Example.limit=True is invalid: expected a number, not a boolean (or None)"),
    ("scale", math.nan, "Example.scale=nan is invalid: expected a finite number"),
    ("scale", math.inf, "Example.scale=inf is invalid: expected a finite number"),
    ("limit", -math.inf, "Example.limit=-inf is invalid: expected a finite number"),
])
def test_a_field_takes_its_own_type_and_the_error_names_field_and_value(field, value, expected):
    with pytest.raises(ValueError) as info:
        Example(**{field: value})
    assert str(info.value) == expected
    example = Example()
    with pytest.raises(ValueError, match="is invalid"):
        setattr(example, field, value)  # assignment is checked alike, the old value kept
    assert getattr(example, field) == getattr(Example(), field)


def test_values_of_the_right_type_are_kept():
    example = Example(switch=False, maybe=None, count=3, scale=2, limit=0.5)
    assert (example.switch, example.maybe, example.count, example.scale, example.limit) == (
        False, None, 3, 2.0, 0.5)


def test_the_library_configs_refuse_numbers_for_switches_and_nan_for_numbers():
    # PatternBoostConfig(progress="yes") and RouterOptions(stay=1) were read as True,
    # RouterOptions(temperature=nan) was taken
    with pytest.raises(ValueError, match=r"PatternBoostConfig.progress='yes' is invalid: "
                                         r"expected True or False"):
        PatternBoostConfig(progress="yes")
    with pytest.raises(Exception, match=r"stay"):
        RouterOptions(stay=1)
    with pytest.raises(Exception, match=r"temperature"):
        RouterOptions(temperature=math.nan)
    assert issubclass(RouterOptions, Strict)


def test_a_run_config_names_a_switch_given_a_number(tmp_path):
    # output.overwrite = 1 overwrote the run folder; train.compile = "yes" compiled
    path = tmp_path / "run.yaml"
    path.write_text("name: r\ntask: {name: polynomial_regression, n_train: 64, n_eval: 32}\n"
                    "model: {d_model: 16, n_heads: 2, n_layers: 1}\ntrain: {steps: 2}\n")
    with pytest.raises(ValueError, match=r"output\.overwrite: got 1; expected True or False"):
        load_config(path, ["output.overwrite=1"])
    with pytest.raises(ValueError, match=r"train\.compile: got 'yes'; expected True or False"):
        load_config(path, ["train.compile='yes'"])
    assert load_config(path, ["output.overwrite=true"]).output.overwrite is True


def test_a_choice_of_numbers_does_not_take_a_bool_for_one():
    class Heads(ConfigModel):
        n: Annotated[Literal[1, 2, 4], choice((1, 2, 4))] = 1

    with pytest.raises(ValueError, match=r"Heads.n=True is invalid: expected one of \(1, 2, 4\)"):
        Heads(n=True)
    assert Heads(n=2).n == 2
