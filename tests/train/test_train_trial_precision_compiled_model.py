"""``train.compile`` compiles the training step while checkpoints keep the model's own keys; a
model the caller wrapped in ``torch.compile`` is refused when the trainer is built. Such a model
used to train, and its checkpoints held ``_orig_mod.``-prefixed keys and the model class
``OptimizedModule`` in ``config.yaml``: resuming the run with the model itself was refused
("model.class was "OptimizedModule", now "TinyClassifier"") and its weights loaded into no
eager model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from tiny_training import OPTIONS, TinyClassifier, make_data, make_lm_trainer

from graded.train.checkpoint import CheckpointManager
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer


def test_a_model_wrapped_by_torch_compile_is_refused_before_anything_is_written(tmp_path):
    model = torch.compile(TinyClassifier())  # lazy: nothing is compiled here
    with pytest.raises(TypeError, match=r"model is torch\.compile's wrapper of a TinyClassifier"
                       r": its checkpoints would hold '_orig_mod\.'-prefixed keys.*expected "
                       r"the model itself, with TrainOptions\(compile=True\)"):
        Trainer(model, make_data(96, 1), make_data(48, 2), kind="classification",
                options=TrainOptions(**OPTIONS), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_compiled_run_saves_the_models_keys_and_resumes_eager(tmp_path):
    """train.compile: the checkpoint holds keys of the model's own state dict, and the
    run resumed without compiling continues the compiled run (to 1e-6: compiled and eager
    kernels round differently)."""
    run = tmp_path / "run"
    first = make_lm_trainer(run, "dyck", steps=4, compile=True).fit(pause_after=2)
    saved = CheckpointManager(run / "checkpoints").path_for(2) / "model.safetensors"
    eager = make_lm_trainer(run, "dyck", steps=4)
    keys = set(load_file(saved))  # a tied weight is saved once
    assert keys <= set(eager.model.state_dict()) and "decoder.embed.tokens.weight" in keys
    assert not any("_orig_mod" in key for key in keys)
    rest = eager.fit(resume_from=run)
    whole = make_lm_trainer(tmp_path / "whole", "dyck", steps=4, compile=True).fit()
    assert first.losses + rest.losses == pytest.approx(whole.losses, rel=1e-6)
