"""Generation with a model that grades tokens (000 §6.2): each new token graded by the task's
grading of the extended sequence, against a naive loop that regrades and reruns everything."""

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM

V, OPEN, CLOSE = 11, 3, 4


def config(**kw) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=16, n_heads=2, n_layers=2, max_len=24,
                positional="learned", grading="exponential", grading_base=2.0,
                token_grading=True)
    return TransformerConfig(**{**base, **kw})


def depth(ids):
    """A causal grading: the depth of OPEN/CLOSE brackets, as Dyck grades tokens."""
    out, d = [], 0
    for t in ids:
        if t == OPEN:
            out.append(d)
            d += 1
        elif t == CLOSE:
            d = max(d - 1, 0)
            out.append(d)
        else:
            out.append(d)
    return out


def naive_lm(model, prompt, n):
    """Greedy decoding of one unpadded row, regrading and rerunning the whole sequence."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([ids])
            logits = model(x, token_grades=torch.tensor([depth(ids)], dtype=torch.float64))
            ids.append(int(logits[0, -1].argmax()))
    return ids


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_token_graded_lm_generates_what_a_naive_regrading_loop_generates(use_cache):
    torch.manual_seed(1)
    model = TransformerLM(config(logit_bias=True, grading_base=4.0)).double().eval()
    with torch.no_grad():  # brackets likely, so that the grades change as tokens come
        model.head.proj.bias[[OPEN, CLOSE]] += 0.5
    rows = [[1, OPEN, OPEN, 2], [OPEN, 5]]
    padded = torch.tensor([rows[0], [0, 0, *rows[1]]])
    mask = torch.tensor([[False] * 4, [True, True, False, False]])
    grades = torch.tensor([depth(rows[0]), [0, 0, *depth(rows[1])]])
    out = model.generate(padded, 8, key_padding_mask=mask, token_grades=grades,
                         token_grader=depth, use_cache=use_cache)
    assert out[0].tolist() == naive_lm(model, rows[0], 8)
    assert out[1, 2:].tolist() == naive_lm(model, rows[1], 8)
    generated = out[:, 4:]
    assert ((generated == OPEN) | (generated == CLOSE)).any()  # grades did move
    ungraded_new = model.generate(padded, 8, key_padding_mask=mask, token_grades=grades,
                                  token_grader=lambda s: [*depth(s[:-1]), 0],
                                  use_cache=use_cache)
    assert not torch.equal(ungraded_new, out)  # the new tokens' grades matter here
    beams = [model.generate(padded, 6, key_padding_mask=mask, token_grades=grades,
                            token_grader=depth, num_beams=3, use_cache=c) for c in (True, False)]
    assert torch.equal(beams[0], beams[1])
    one = model.generate(padded, 6, key_padding_mask=mask, token_grades=grades,
                         token_grader=depth, num_beams=1, use_cache=use_cache)
    assert torch.equal(one, out[:, :10])


def test_prompt_grades_given_as_lists_generate_what_a_naive_regrading_loop_generates():
    torch.manual_seed(1)
    model = TransformerLM(config(logit_bias=True, grading_base=4.0)).double().eval()
    prompt = [1, OPEN, OPEN, 2]
    out = model.generate(torch.tensor([prompt]), 6, token_grades=[depth(prompt)],
                         token_grader=depth)
    assert out[0].tolist() == naive_lm(model, prompt, 6)
    with pytest.raises(ValueError, match=r"token_grades must be a tensor or nested lists .*"
                                         r"\(1, 4\), got \[\[0\], \[0, 1\]\]"):
        model.generate(torch.tensor([prompt]), 2, token_grades=[[0], [0, 1]],
                       token_grader=depth)


def test_a_token_graded_seq2seq_decodes_what_a_naive_regrading_loop_decodes():
    torch.manual_seed(3)
    cfg = config(n_layers=1, logit_bias=True, grading_base=4.0)
    model = Seq2SeqTransformer(cfg).double().eval()
    src = torch.tensor([[OPEN, 2, OPEN, CLOSE, 7]])
    src_grades = torch.tensor([depth(src[0].tolist())])
    bos = 1
    out = model.generate(src, 7, bos_token_id=bos, token_grades=src_grades, token_grader=depth)
    ids = [bos]
    with torch.no_grad():
        memory = model.encode(src, token_grades=src_grades.double())
        for _ in range(7):
            logits = model.decode(torch.tensor([ids]), memory,
                                  token_grades=torch.tensor([depth(ids)]).double())
            ids.append(int(logits[0, -1].argmax()))
    assert out[0].tolist() == ids
    ungraded_new = model.generate(src, 7, bos_token_id=bos, token_grades=src_grades,
                                  token_grader=lambda s: [*depth(s[:-1]), 0])
    assert not torch.equal(ungraded_new, out)  # the new tokens' grades matter here


def test_token_graded_generation_errors_name_what_is_missing():
    torch.manual_seed(0)
    model = TransformerLM(config()).eval()
    ids = torch.tensor([[OPEN, 2]])
    with pytest.raises(ValueError, match=r"without token_grades: pass the grades of the input's "
                       r"tokens, shape \(batch, length\) = \(1, 2\)"):
        model.generate(ids, 2)
    with pytest.raises(ValueError, match="needs token_grader"):
        model.generate(ids, 2, token_grades=torch.zeros(1, 2))
    with pytest.raises(ValueError, match=r"token_grades has shape \(1, 3\); expected the "
                       r"input's \(1, 2\)"):
        model.generate(ids, 2, token_grades=torch.zeros(1, 3), token_grader=depth)
    with pytest.raises(ValueError, match="token_grader gave 1 grades for a sequence of 3"):
        model.generate(ids, 2, token_grades=torch.zeros(1, 2), token_grader=lambda s: [0])
    with pytest.raises(ValueError, match=r"graded token .* with -1; expected a finite grade"):
        model.generate(ids, 2, token_grades=torch.zeros(1, 2),
                       token_grader=lambda s: [0] * (len(s) - 1) + [-1])
    plain = TransformerLM(TransformerConfig(vocab_size=V, d_model=16, n_heads=2, n_layers=1))
    with pytest.raises(ValueError, match="token_grader was given, but this model does not "
                       "grade tokens"):
        plain.generate(ids, 2, token_grader=depth)
