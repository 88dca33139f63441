"""A backend's bool options (``store_weights``, ``checkpointing``, ``ignore_dropout``,
``share_kv``, ``shared_qk``) are checked as every other bool of the library is
(:func:`graded.checks.check_bool`): a NumPy bool is the bool it holds, kept as the Python bool,
and anything else is refused with check_bool's words after the backend's name. The refusal is
a ``TypeError`` (as check_bool's) and a ``ValueError`` (as every other option's refusal), and
a config that gives such a value is refused when it is made, naming the option."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from graded.attention.backends import _REGISTRY, available_backends, get_backend
from graded.attention.backends.chunked import chunked_attention
from graded.checks import check_bool

# the options a backend needs besides its bool option (no default)
NEEDED = {"block_sparse": {"layout": [[True]]}, "linformer": {"max_len": 16, "rank": 4}}


def bool_options() -> list[tuple[str, str, bool]]:
    """(backend, option, default) of every registered backend's bool option: the
    constructor's parameters whose default is a bool."""
    found = []
    for name in available_backends():
        for option, spec in inspect.signature(_REGISTRY[name].__init__).parameters.items():
            if isinstance(spec.default, bool):
                found.append((name, option, spec.default))
    return found


BOOL_OPTIONS = bool_options()
IDS = [f"{name}.{option}" for name, option, _ in BOOL_OPTIONS]


def test_the_bool_options_found_are_those_the_backends_document():
    assert {(name, option) for name, option, _ in BOOL_OPTIONS} == {
        ("chunked", "checkpointing"), ("explicit", "store_weights"),
        ("linear", "ignore_dropout"), ("performer", "ignore_dropout"),
        ("linformer", "share_kv"), ("lsh", "shared_qk")}


@pytest.mark.parametrize("name,option,default", BOOL_OPTIONS, ids=IDS)
def test_a_numpy_bool_is_the_bool_it_holds_when_built_and_set_later(name, option, default):
    """np.bool_(not default) builds the backend a Python ``not default`` builds; set later,
    np.bool_(the value in force) is taken (a fixed option too) and kept as a Python bool."""
    flipped = get_backend(name, **NEEDED.get(name, {}), **{option: np.bool_(not default)})
    assert getattr(flipped, option) is (not default)
    setattr(flipped, option, np.bool_(not default))
    assert getattr(flipped, option) is (not default)
    backend = get_backend(name, **NEEDED.get(name, {}))
    setattr(backend, option, np.bool_(default))
    assert getattr(backend, option) is default


@pytest.mark.parametrize("value", [1, 0, "no", "false", None, 1.0])
@pytest.mark.parametrize("name,option,default", BOOL_OPTIONS, ids=IDS)
def test_a_value_that_is_not_a_bool_is_refused_in_check_bools_words(name, option, default,
                                                                      value):
    """The message is check_bool's for "<backend> backend: <option>", e.g.
    "explicit backend: store_weights must be True or False, got 1 (int)"; the option in
    force is unchanged."""
    expected = f"{name} backend: {option} must be True or False, got {value!r} " \
               f"({type(value).__name__})"
    with pytest.raises(TypeError) as built:
        get_backend(name, **NEEDED.get(name, {}), **{option: value})
    assert str(built.value) == expected
    with pytest.raises(TypeError) as same_words:
        check_bool(f"{name} backend: {option}", value)
    assert str(same_words.value) == expected
    backend = get_backend(name, **NEEDED.get(name, {}))
    with pytest.raises(TypeError) as later:
        setattr(backend, option, value)
    assert str(later.value) == expected
    assert getattr(backend, option) is default


@pytest.mark.parametrize("name,option,default", BOOL_OPTIONS, ids=IDS)
def test_the_refusal_is_a_value_error_too(name, option, default):
    """Callers that catch the ValueError of a refused option (it was one before) still do."""
    with pytest.raises(ValueError, match=f"{option} must be True or False, got 'yes'"):
        get_backend(name, **NEEDED.get(name, {}), **{option: "yes"})


def test_chunked_attentions_checkpointing_takes_a_numpy_bool_and_refuses_a_count():
    q = torch.randn(1, 2, 5, 4, requires_grad=True)
    want = chunked_attention(q, q, q, query_chunk=2, key_chunk=2, checkpointing=True)
    got = chunked_attention(q, q, q, query_chunk=2, key_chunk=2, checkpointing=np.True_)
    torch.testing.assert_close(got, want)
    with pytest.raises(TypeError, match=r"^chunked backend: checkpointing must be True or "
                                        r"False, got 1 \(int\)$"):
        chunked_attention(q, q, q, checkpointing=1)


@pytest.mark.parametrize("name,option,default", BOOL_OPTIONS, ids=IDS)
def test_a_config_refuses_a_bool_option_that_is_not_a_bool_when_made(name, option, default):
    """TransformerConfig builds the backend to check its options: the error names the field,
    the backend and the option, in check_bool's words."""
    from graded.transformer.config import TransformerConfig

    options = {**NEEDED.get(name, {}), option: 1}
    with pytest.raises(ValueError) as refused:
        TransformerConfig(attn_backend=name, attn_backend_options=options)
    message = str(refused.value)
    assert "attn_backend_options=" in message
    assert f"{name} backend: {option} must be True or False, got 1 (int)" in message
    taken = TransformerConfig(attn_backend=name,
                              attn_backend_options={**NEEDED.get(name, {}),
                                                    option: np.bool_(default)})
    assert taken.attn_backend == name


def test_a_run_config_refuses_a_bool_option_that_is_not_a_bool_naming_the_key():
    from graded.config import ConfigError, apply_overrides, validate_config

    data = apply_overrides({"task": {"name": "dyck", "n_train": 8, "n_eval": 8}},
                           ["model.attn_backend=linformer",
                            "model.attn_backend_options.max_len=64",
                            "model.attn_backend_options.share_kv='no'"])
    with pytest.raises(ConfigError) as refused:
        validate_config(data)
    lines = str(refused.value).splitlines()
    assert lines[0] == "invalid config <dict>:"
    assert lines[1].startswith("  model: TransformerConfig.attn_backend_options=")
    assert lines[1].endswith("(linformer backend: share_kv must be True or False, got 'no' "
                             "(str))")
