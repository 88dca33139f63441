"""The models trace into one graph under ``torch.compile``: no graph breaks (checked with
``torch._dynamo.explain``, which traces without compiling). Input checks that read tensor
values run in eager calls only."""

import pytest
import torch
import torch._dynamo as dynamo

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.morphic import MorphicConfig, build_morphic_model
from graded.transformer.models import TransformerClassifier

IDS = torch.randint(1, 32, (2, 12), generator=torch.Generator().manual_seed(0))
PAD = torch.zeros(2, 12, dtype=torch.bool)
PAD[1, -3:] = True


def config(**kw) -> TransformerConfig:
    return TransformerConfig(vocab_size=32, d_model=16, n_heads=2, n_layers=2, max_len=16, **kw)


def breaks(model, *args, **kwargs) -> list[str]:
    dynamo.reset()
    explained = dynamo.explain(model)(*args, **kwargs)
    return [str(b.reason).splitlines()[0] for b in explained.break_reasons]


CASES = {
    "lm": lambda: (TransformerLM(config()), (IDS, PAD), {}),
    "egt lm": lambda: (TransformerLM(config(grading="exponential")), (IDS, PAD), {}),
    "lgt classifier": lambda: (TransformerClassifier(config(grading="linear"), 3), (IDS, PAD), {}),
    "seq2seq": lambda: (Seq2SeqTransformer(config()), (IDS, IDS, PAD), {}),
    "token-graded lm": lambda: (TransformerLM(config(grading="exponential", token_grading=True)),
                                (IDS, PAD), {"token_grades": IDS % 3}),
    "morphic": lambda: (build_morphic_model(MorphicConfig.from_dict({
        "vocab_size": 32, "max_len": 16,
        "grades": [{"label": "g0", "dim": 8, "index": 0}, {"label": "g1", "dim": 8, "index": 1}],
        "layers": [{"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 16}},
                   {"edges": [["g0", "g1", "att"]], "block": "attention",
                    "block_options": {"num_heads": 2, "head_dim": 4}}]})), (IDS,), {}),
}


def morphic(train_routing: str):
    return build_morphic_model(MorphicConfig.from_dict({
        "vocab_size": 32, "max_len": 16,
        "grades": [{"label": "g0", "dim": 8, "index": 0}, {"label": "g1", "dim": 8, "index": 1}],
        "layers": [{"banded": [0, 1], "block": "ffn", "block_options": {"hidden": 16}},
                   {"edges": [["g0", "g1", "att"], ["g1", "g1", "ffn"]], "block": "attention",
                    "train_routing": train_routing,
                    "block_options": {"num_heads": 2, "head_dim": 4}}]}))


def morphic_batch():
    targets = IDS.roll(-1, 1)
    targets[PAD] = -100
    return IDS, targets, PAD


@pytest.mark.parametrize("train_routing", ["context", "utility"])
def test_morphic_training_step_has_no_graph_breaks(train_routing):
    """What the trainer compiles for a morphic LM (its training loss: utilities of every edge,
    L_GT, distillation, metrics as tensors), in training mode, with ignored (padded) targets."""
    from graded.kinds.sequence import _TrainingLoss

    model = morphic(train_routing).train()
    assert breaks(_TrainingLoss(model), *morphic_batch()) == []


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_has_no_graph_breaks(name):
    model, args, kwargs = CASES[name]()
    assert breaks(model.eval(), *args, **kwargs) == []


def test_value_checks_still_run_in_eager_calls():
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\)"):
        TransformerLM(config())(IDS + 40)


@pytest.mark.slow
@pytest.mark.parametrize("train_routing", ["context", "utility"])
def test_compiled_morphic_training_terms_equal_eager(train_routing):
    from graded.kinds.sequence import _TrainingLoss

    torch.manual_seed(0)
    model = morphic(train_routing).eval()  # deterministic routing: eager and compiled agree
    step = _TrainingLoss(model)
    loss, terms = step(*morphic_batch())
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad],
                                allow_unused=True)
    dynamo.reset()
    c_loss, c_terms = torch.compile(step)(*morphic_batch())
    c_grads = torch.autograd.grad(c_loss, [p for p in model.parameters() if p.requires_grad],
                                  allow_unused=True)
    torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-6)
    for k in terms:
        torch.testing.assert_close(c_terms[k], terms[k], rtol=1e-5, atol=1e-6, equal_nan=True)
    for a, b in zip(c_grads, grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
