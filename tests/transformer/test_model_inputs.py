"""Model inputs of the wrong shape or dtype: refused at the model's entry, naming the value and
what was expected, where they used to fail deep inside torch (or not at all)."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.transformer import TransformerClassifier
from graded.transformer.models import TransformerEncoder


def features_classifier(dtype=torch.float32, **grading):
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=None, input_dim=5, d_model=16, n_heads=2, n_layers=1,
                            max_len=12, **grading)
    return TransformerClassifier(cfg, 3).to(dtype)


@pytest.mark.parametrize(("features", "model", "message"), [
    (torch.float64, torch.float32, r"features are torch.float64, the model's weights "
                                   r"torch.float32; expected the same dtype"),
    (torch.float32, torch.bfloat16, r"features are torch.float32, the model's weights "
                                    r"torch.bfloat16"),
    (torch.int64, torch.float32, r"features must be a floating tensor, got torch.int64"),
])
def test_features_of_another_dtype_than_the_model_are_refused_naming_both(features, model,
                                                                          message):
    """They failed in the input projection ('mat1 and mat2 must have the same dtype'), which
    names neither the features nor the fix."""
    clf = features_classifier(model)
    x = torch.randn(2, 4, 5).to(features)
    with pytest.raises(TypeError, match=message):
        clf(x)


def test_features_of_the_models_dtype_or_under_autocast_are_taken_as_before():
    """bfloat16 features of a bfloat16 model, float32 features under CPU autocast, and
    bfloat16 features that a float32 input grading promotes to float32 (the projection then
    runs in float32, as it did) give finite outputs."""
    x = torch.randn(2, 4, 5)
    assert torch.isfinite(features_classifier(torch.bfloat16)(x.bfloat16()).float()).all()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(features_classifier()(x).float()).all()
    graded = features_classifier(grading="linear", grade_input=True)
    torch.testing.assert_close(graded(x.bfloat16()), graded(x.bfloat16().float()))


@pytest.mark.parametrize("model", ["lm", "encoder", "seq2seq"])
def test_token_ids_of_one_dimension_are_refused_naming_the_shape(model):
    """(T,) ids used to fail on unpacking the shape ('not enough values to unpack')."""
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=11, d_model=16, n_heads=2, n_layers=1, max_len=12)
    ids = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match=r"token ids must have shape \(batch, length\), got "
                                         r"\(3,\)"):
        if model == "lm":
            TransformerLM(cfg)(ids)
        elif model == "encoder":
            TransformerEncoder(cfg)(ids)
        else:
            Seq2SeqTransformer(cfg)(ids[None], ids)


def test_a_classifier_with_num_outputs_true_is_refused_naming_it():
    """True is an int: it used to fail in the head's ``torch.empty``."""
    with pytest.raises(ValueError, match=r"num_outputs must be a positive int, got True"):
        TransformerClassifier(TransformerConfig(vocab_size=11, d_model=16, n_heads=2,
                                                n_layers=1, max_len=12), True)
