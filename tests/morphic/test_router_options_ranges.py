"""RouterOptions refuses the temperatures and init_std that the Router refuses, when the
config is read (not later, when a layer is built, nor never: RouterOptions(temperature=0)
was taken)."""

import math

import pytest

from graded.morphic.config import RouterOptions, build_morphic_model
from graded.morphic.edges import EdgeSet
from graded.morphic.router import Router
from graded.morphic.state import GradedStateSpace

BAD = [
    ("temperature", 0), ("temperature", 0.0), ("temperature", -1.0), ("temperature", math.inf),
    ("gumbel_temperature", 0), ("gumbel_temperature", -0.5),
    ("gumbel_temperature", math.nan),
    ("init_std", -0.01), ("init_std", math.inf),
]
GOOD = [("temperature", 0.1), ("temperature", 3), ("gumbel_temperature", 0.5),
        ("init_std", 0.0), ("init_std", 0.1)]


def _router(**options):
    space = GradedStateSpace([("g0", 4), ("g1", 4)])
    edges = EdgeSet.explicit(space, [("g0", "g1", "up"), ("g1", "g0", "down")])
    return Router(space, edges, **options)


@pytest.mark.parametrize(("name", "value"), BAD)
def test_router_options_refuse_what_the_router_refuses(name, value):
    with pytest.raises(ValueError, match=name):
        _router(**{name: value})  # the rule the config must follow
    with pytest.raises(ValueError, match=rf"{name}[\s\S]*finite number [>]"):
        RouterOptions(**{name: value})


@pytest.mark.parametrize(("name", "value"), GOOD)
def test_router_options_take_what_the_router_takes(name, value):
    _router(**{name: value})
    assert getattr(RouterOptions(**{name: value}), name) == value


def test_a_router_temperature_of_zero_is_named_with_its_config_path():
    config = {"vocab_size": 5, "grades": [{"label": "g0", "dim": 4, "index": 0},
                                            {"label": "g1", "dim": 4, "index": 1}],
              "layers": [{"banded": [0], "router": {"temperature": 0}}]}
    with pytest.raises(ValueError, match=r"layers\.0\.router\.temperature=0 is invalid: "
                                         r"expected a finite number > 0"):
        build_morphic_model(config)
