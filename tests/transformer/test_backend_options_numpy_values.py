"""A backend takes NumPy scalars as its options (``np.False_``, ``np.int64(8)``); the config
keeps them as the Python values they hold, so that it saves and loads: kept as given, they
made ``to_json`` fail with a serialisation error."""

import json

import numpy as np

from graded.transformer import TransformerConfig

BASE = dict(vocab_size=16, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=32)


def test_numpy_options_are_kept_as_python_values_and_the_config_round_trips():
    config = TransformerConfig(
        **BASE, attn_backend="sliding_window",
        attn_backend_options={"window": np.int64(8)},
        cross_attn_backend="explicit", cross_attn_backend_options={"store_weights": np.True_},
        attn_backend_cycle=[{"options": {"window": np.int32(4)}},
                            {"backend": "linear", "options": {"ignore_dropout": np.False_}}])
    assert config.attn_backend_options == {"window": 8}
    assert type(config.attn_backend_options["window"]) is int
    assert config.cross_attn_backend_options["store_weights"] is True
    assert type(config.attn_backend_cycle[0]["options"]["window"]) is int
    assert config.attn_backend_cycle[1]["options"]["ignore_dropout"] is False
    saved = json.loads(config.model_dump_json())
    assert saved["attn_backend_options"] == {"window": 8}
    assert saved["cross_attn_backend_options"] == {"store_weights": True}
    assert TransformerConfig(**saved) == config


def test_python_options_are_kept_as_they_are():
    options = {"window": 8, "block_size": 16}
    config = TransformerConfig(**BASE, attn_backend="sliding_window",
                               attn_backend_options=options)
    assert config.attn_backend_options == options
