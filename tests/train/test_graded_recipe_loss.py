"""The recipes minimise the graded loss of 000 Def 5.37 (LGT, weights f(q)) and Def 7.1 (EGT,
weights λ_t^q, λ_t annealed): each target token weighted by its grade, against a loop written
out token by token; switchable off, and plain (with a warning) where items carry no grades."""

import math

import pytest
import torch

from graded import Seq2SeqTransformer, TransformerConfig, TransformerLM
from graded.kinds import get_kind
from graded.tasks import get_task
from graded.train.options import TrainOptions
from graded.train.recipes import get_recipe
from graded.train.trainer import Trainer
from graded.transformer.models import TransformerClassifier

RECIPE = {"linear": "lgt-alg5.1", "exponential": "egt-alg7.1"}


def dyck_batch(n: int = 6):
    task = get_task("dyck", max_length=12)
    return task, dict(task.generate(n, seed=0).tensors)


def model_for(task, grading: str) -> TransformerLM:
    torch.manual_seed(0)
    info = task.info()
    return TransformerLM(TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2,
                                           n_layers=1, max_len=task.max_len, grading=grading,
                                           grading_base=3.0)).double()


def naive_graded_loss(logits, targets, grades, weight_of) -> tuple[float, int]:
    """Σ_i w(q_i) · (−log softmax(ŷ_i)[y_i]) over scored tokens, and their number."""
    total, count = 0.0, 0
    for b in range(targets.shape[0]):
        for i in range(targets.shape[1]):
            y = int(targets[b, i])
            if y == -100:
                continue
            row = logits[b, i].tolist()
            top = max(row)
            log_z = top + math.log(sum(math.exp(v - top) for v in row))
            total += weight_of(float(grades[b, i])) * (log_z - row[y])
            count += 1
    return total, count


@pytest.mark.parametrize("grading", ["linear", "exponential"])
def test_recipe_loss_equals_the_graded_loss_written_out(grading):
    task, batch = dyck_batch()
    model = model_for(task, grading)
    recipe = get_recipe(RECIPE[grading])
    opt = torch.optim.AdamW(recipe.param_groups(model, lr=1e-3, weight_decay=0.0))
    recipe.on_step(model, opt, 3, 10)  # EGT: λ_t = 1 + (3 − 1)·4/10 = 1.8
    lam = 1.0 + 2.0 * 4 / 10

    def weight_of(q: float) -> float:
        return q + 1.0 if grading == "linear" else lam ** q  # f = shift; λ_t^q

    kind = get_kind("lm")
    weights = recipe.loss_weights(model, batch, kind.graded_items)
    got = kind.loss(model, batch, weights=weights)
    logits = model(batch["inputs"], batch["key_padding_mask"])
    want, count = naive_graded_loss(logits.detach(), batch["targets"], batch["token_grades"],
                                    weight_of)
    assert got.count == count
    assert float(got.total.detach()) == pytest.approx(want, rel=1e-6)  # scored in float32
    assert float(batch["token_grades"].max()) >= 2  # the weights really vary


def test_weights_all_one_and_switching_off_give_the_plain_loss():
    task, batch = dyck_batch()
    model = model_for(task, "exponential")
    kind = get_kind("lm")
    plain = kind.loss(model, batch)
    ones = kind.loss(model, batch, weights=torch.ones_like(batch["targets"], dtype=torch.float64))
    assert float(ones.total.detach()) == pytest.approx(float(plain.total.detach()), rel=1e-12)
    assert get_recipe("egt-alg7.1", graded_loss=False).loss_weights(model, batch,
                                                                    "token_grades") is None
    assert get_recipe("plain").loss_weights(model, batch, "token_grades") is None


def test_items_without_grades_train_on_the_plain_loss_with_a_warning():
    task, batch = dyck_batch()
    model = model_for(task, "linear")
    recipe = get_recipe("lgt-alg5.1")
    without = {k: v for k, v in batch.items() if k != "token_grades"}
    with pytest.warns(RuntimeWarning, match="no 'token_grades'.*plain loss"):
        assert recipe.loss_weights(model, without, "token_grades") is None
    classifier = TransformerClassifier(TransformerConfig(vocab_size=7, d_model=8, n_heads=2,
                                                         n_layers=1, grading="linear"), 3)
    kind = get_kind("classification")
    with pytest.warns(RuntimeWarning, match="carry no grades"):
        assert recipe.loss_weights(classifier, {"inputs": batch["inputs"]},
                                   kind.graded_items) is None
    with pytest.raises(ValueError, match="takes no loss weights"):
        kind.loss(classifier, {"inputs": batch["inputs"], "targets": torch.zeros(6).long()},
                  weights=torch.ones(6))


def test_seq2seq_weights_target_tokens_by_their_decoder_grades():
    task = get_task("polynomials_seq2seq", max_degree=2)
    batch = dict(task.generate(4, seed=0).tensors)
    info = task.info()
    torch.manual_seed(0)
    model = Seq2SeqTransformer(TransformerConfig(vocab_size=info["vocab_size"], d_model=16,
                                                 n_heads=2, n_layers=1, max_len=16,
                                                 grading="exponential")).double()
    kind = get_kind("seq2seq")
    assert kind.graded_items == "decoder_token_grades"
    weights = get_recipe("egt-alg7.1").loss_weights(model, batch, kind.graded_items)
    torch.testing.assert_close(weights, 2.0 ** batch["decoder_token_grades"].double())
    assert not torch.equal(kind.loss(model, batch, weights=weights).total,
                           kind.loss(model, batch).total)


def test_the_trainer_minimises_the_graded_loss(tmp_path):
    """The first logged training loss is the graded loss of the initial model on that step's
    batch: with λ_1 the annealed base, against the same model scored without weights."""
    task, _ = dyck_batch()
    train, test = task.split("random", 32, 8, seed=1)
    model = model_for(task, "exponential").float()
    opts = TrainOptions(steps=1, batch_size=32, lr=1e-3, eval_every=1, log_every=1,
                        progress=False, tensorboard=False, device="cpu", warmup_steps=0)
    kind = get_kind("lm")
    trainer = Trainer(model, train.tensors, test.tensors, kind=kind, options=opts,
                      run_dir=tmp_path / "run", seed=0, recipe="egt-alg7.1")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    base = float(next(g for g in model.modules() if hasattr(g, "base")).base)
    result = trainer.fit()
    model.load_state_dict(before)
    data = dict(train.tensors)
    with torch.no_grad():
        for g in model.modules():
            if hasattr(g, "set_base"):
                g.set_base(base)
        weights = base ** data["token_grades"].float()
        graded = kind.loss(model, data, weights=weights)
        plain = kind.loss(model, data)
    assert result.losses[0] == pytest.approx(float(graded.mean), rel=1e-5)
    assert result.losses[0] != pytest.approx(float(plain.mean), rel=1e-3)
