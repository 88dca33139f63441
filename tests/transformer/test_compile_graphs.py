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


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_has_no_graph_breaks(name):
    model, args, kwargs = CASES[name]()
    assert breaks(model.eval(), *args, **kwargs) == []


def test_value_checks_still_run_in_eager_calls():
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\)"):
        TransformerLM(config())(IDS + 40)
