"""Backends pickled whole (``torch.save(model)``, a worker process) by the code before their
options became properties checked when set: they held ``scale``, ``window``, ... as plain
attributes, and the performer backend no ``seed`` at all. Such a pickle, made here by that
code in a subprocess, loads with today's code, reads every option it was built with, computes
what it computed there, and takes options set later as a fresh backend does."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import graded.attention.backends as backends

ROOT = Path(__file__).resolve().parents[2]
BEFORE = "dc0a368"  # the last commit whose backends keep their options as plain attributes

# backend name -> options at construction (the performer's features drawn at construction)
BUILT = {
    "bigbird": {"block_size": 4, "seed": 2},
    "block_sparse": {"block_size": 8},  # layout added in the script (a tensor)
    "chunked": {"query_chunk": 4, "key_chunk": 4, "scale": 0.3},
    "dilated": {"window": 3, "dilation": 2},
    "explicit": {"scale": 0.7},
    "full": {"scale": 0.4},
    "linear": {"chunk_size": 4, "eps": 1e-5},
    "linformer": {"max_len": 16, "rank": 4},
    "lsh": {"n_buckets": 4, "chunk_size": 4, "seed": 1},
    "performer": {"num_features": 8, "seed": 3, "head_dim": 4, "redraw_interval": 2},
    "sliding_window": {"window": 4},
    "sliding_window_block": {"window": 4, "block_size": 8},
    "sparse_fixed": {"block": 4, "summary": 1},
}

OLD_SIDE = """
import json, pickle, sys
import torch
import graded.attention.backends as backends

built = json.loads(sys.argv[2])
torch.manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 4) for _ in range(3))
pickled, outputs, options = {}, {}, {}
for key, opts in built.items():
    name = key.removesuffix("_block")
    layout = torch.tensor([[True, False], [True, True]])
    extra = {"layout": layout} if name == "block_sparse" else {}
    torch.manual_seed(1)
    backend = backends._REGISTRY[name](**opts, **extra).eval()
    causal = backend.capabilities.causal
    outputs[key] = backend(q, k, v, is_causal=causal)
    options[key] = {o: getattr(backend, o) for o in opts if o in backend.__dict__}
    pickled[key] = pickle.dumps(backend)
torch.save({"q": q, "k": k, "v": v, "outputs": outputs}, sys.argv[1] + ".pt")
with open(sys.argv[1], "wb") as fh:
    pickle.dump({"pickled": pickled, "options": options}, fh)
"""


@pytest.fixture(scope="module")
def old_pickles(tmp_path_factory) -> dict:
    """Backends pickled by the code of :data:`BEFORE`, their outputs there and the options
    they read there (run from that commit's sources, in a subprocess)."""
    tree = tmp_path_factory.mktemp("old_code")
    known = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{BEFORE}^{{commit}}"],
                           capture_output=True)
    if known.returncode != 0:
        pytest.skip(f"commit {BEFORE} is not in this checkout's history (a shallow clone?)")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "src"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    out = tree / "backends.pkl"
    subprocess.run([sys.executable, "-c", OLD_SIDE, str(out), json.dumps(BUILT)], check=True,
                   env={"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin"})
    with open(out, "rb") as fh:
        found = pickle.load(fh)
    return {**found, **torch.load(str(out) + ".pt")}


def test_the_old_pickles_cover_every_backend():
    assert sorted({k.removesuffix("_block") for k in BUILT}) == backends.available_backends()


@pytest.mark.parametrize("key", sorted(BUILT))
def test_a_backend_pickled_by_the_old_code_reads_its_options_and_computes_as_there(
        old_pickles, key):
    """Reading an option raised AttributeError (the property's slot ``_scale`` was missing;
    the performer's ``seed`` was never stored)."""
    backend = pickle.loads(old_pickles["pickled"][key])
    for option, value in BUILT[key].items():
        assert getattr(backend, option) == value, option
    for option, value in old_pickles["options"][key].items():  # as the old code read them
        assert getattr(backend, option) == value, option
    q, k, v = old_pickles["q"], old_pickles["k"], old_pickles["v"]
    out = backend(q, k, v, is_causal=backend.capabilities.causal)
    torch.testing.assert_close(out, old_pickles["outputs"][key], rtol=0, atol=0)


@pytest.mark.parametrize("key", sorted(BUILT))
def test_an_option_set_on_an_old_pickle_acts_as_on_a_fresh_backend(old_pickles, key):
    """The old pickle, with a scale (the chunk size of linear) set after loading, computes
    what a backend built today with those options and the same state computes."""
    name = key.removesuffix("_block")
    loaded = pickle.loads(old_pickles["pickled"][key])
    extra = ({"layout": torch.tensor([[True, False], [True, True]])}
             if name == "block_sparse" else {})
    torch.manual_seed(1)
    fresh = backends._REGISTRY[name](**BUILT[key], **extra).eval()
    fresh.load_state_dict(loaded.state_dict())
    option, value = ("chunk_size", 8) if name == "linear" else ("scale", 0.25)
    setattr(loaded, option, value)
    setattr(fresh, option, value)
    with pytest.raises(ValueError, match=option):  # checked when set, as a fresh one is
        setattr(loaded, option, 0)
    q, k, v = old_pickles["q"], old_pickles["k"], old_pickles["v"]
    causal = fresh.capabilities.causal
    torch.testing.assert_close(loaded(q, k, v, is_causal=causal),
                               fresh(q, k, v, is_causal=causal), rtol=0, atol=0)


def test_an_old_performer_pickle_restarts_its_features_from_its_seed(old_pickles):
    """Its seed came from its generator: a feature option set later draws the features a
    backend built with that seed and option draws."""
    loaded = pickle.loads(old_pickles["pickled"]["performer"])
    loaded.num_features = 6
    fresh = backends.PerformerBackend(**{**BUILT["performer"], "num_features": 6})
    torch.testing.assert_close(loaded.omega, fresh.omega, rtol=0, atol=0)
    assert loaded.omega.shape == (6, 4)


def _as_old_pickle(backend: torch.nn.Module, **options: object) -> dict:
    """``backend``'s pickled state as the old code held it: ``options`` as plain attributes
    (values set after construction, which the old code did not check), not in the slots."""
    state = dict(backend.__getstate__())
    for option, value in options.items():
        state.pop(f"_{option}", None)
        state[option] = value
    return state


@pytest.mark.parametrize(("name", "options", "bad", "message"), [
    ("sliding_window", {"window": 4}, {"window": 0}, r"window must be a positive int"),
    ("dilated", {"window": 3, "dilation": 2}, {"dilation": 0}, r"dilation"),
    ("performer", {"seed": 0}, {"ignore_dropout": "false"}, r"ignore_dropout"),
    ("full", {}, {"scale": -1.0}, r"scale"),
])
def test_an_old_pickle_holding_a_value_its_option_refuses_is_refused_naming_it(
        name, options, bad, message):
    """The old code took options set after construction unchecked; unpickled, such a value
    went to its slot as it was (a window of 0 then failed at the call, "false" was a truthy
    bool). It is checked as the constructor checks it."""
    state = _as_old_pickle(backends._REGISTRY[name](**options), **bad)
    (option, value), = bad.items()
    loaded = backends._REGISTRY[name].__new__(backends._REGISTRY[name])
    with pytest.raises(ValueError, match=rf"a {name} backend unpickled with {option}="
                                         rf"{value!r}, a value its options refuse: .*{message}"):
        loaded.__setstate__(state)


def test_an_old_pickles_valid_options_are_kept_as_checked():
    backend = backends._REGISTRY["sliding_window"](window=4)
    state = _as_old_pickle(backend, window=6, scale=0.5)
    loaded = type(backend).__new__(type(backend))
    loaded.__setstate__(state)
    assert (loaded.window, loaded.scale) == (6, 0.5)
