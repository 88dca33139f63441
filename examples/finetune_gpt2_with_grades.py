"""Fine-tune a (small, randomly initialised) GPT-2 with learnable grades.

A pretrained LM is where most users meet LGT and EGT: convert a Hugging Face GPT-2 into a
graded.TransformerLM, graft an exponential grading whose grades start neutral (the model's
function is unchanged), then train the grades with the rest of the weights by 000 Algorithm 7.1.
With a real checkpoint, pass its local folder to from_gpt2 instead of building one here.
Needs Hugging Face transformers (in the dev extra: pip install -e ".[dev]").

    python examples/finetune_gpt2_with_grades.py
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from graded.interop import from_gpt2, graft_grading
from graded.train import Trainer, TrainOptions, get_recipe

torch.manual_seed(0)
hf = GPT2LMHeadModel(GPT2Config(vocab_size=16, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                bos_token_id=None, eos_token_id=None)).eval()
lm = from_gpt2(hf)
graded = graft_grading(lm, "exponential", learnable_grades=True)

# a toy task: count upwards modulo 16 from a random start
start = torch.randint(0, 16, (512, 1))
seqs = (start + torch.arange(17)) % 16
data = {"inputs": seqs[:, :-1], "targets": seqs[:, 1:]}
ids = data["inputs"][:4]
print(f"grafted model equals GPT-2: max |Δ logits| = "
      f"{(graded(ids) - hf(ids).logits).abs().max().item():.2e}")

# the tokens of this task carry no grades: Algorithm 7.1 on the plain loss
recipe = get_recipe("egt-alg7.1", graded_loss=False)
trainer = Trainer(graded, data, data, kind="lm", recipe=recipe, run_dir="runs/gpt2-egt",
                  options=TrainOptions(steps=60, lr=3e-3, batch_size=32, eval_every=30,
                                       progress=False, tensorboard=False), overwrite=True)
result = trainer.fit()
print(f"after {result.step} steps: token accuracy {result.final_eval['token_accuracy']:.3f}")
grades = graded.feature_grading.grades.detach()
print(f"feature grades moved from 0 to [{grades.min():.3f}, {grades.max():.3f}]")
