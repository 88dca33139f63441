"""Train an EGT classifier on your own tensors with learnable grades (000 Algorithm 7.1).

The label depends on feature 3 only; the input grading starts with that feature graded up,
and training moves the grades. The run folder holds metrics.csv, TensorBoard logs,
grades.jsonl and checkpoints.

    python examples/train_graded_classifier.py
"""

import torch

from graded import TransformerClassifier, TransformerConfig
from graded.train import Trainer, TrainOptions, get_recipe

torch.manual_seed(0)
x = torch.randn(2000, 8, 4)  # 2000 sequences of 8 feature vectors
y = (x[..., 3].sum(1) > 0).long()  # the label lives in feature 3
cfg = TransformerConfig(vocab_size=None, input_dim=4, d_model=32, n_heads=4, n_layers=2,
                        grading="exponential", learnable_grades=True,
                        input_grades=[0, 0, 0, 1])
model = TransformerClassifier(cfg, num_outputs=2)
train, test = {"inputs": x[:1600], "targets": y[:1600]}, {"inputs": x[1600:], "targets": y[1600:]}
# Algorithm 7.1's regulariser, annealing and learning-rate bound on the plain loss: the two
# classes carry no grades (Trainer(output_grades=...) would weight the loss by them)
recipe = get_recipe("egt-alg7.1", graded_loss=False)
trainer = Trainer(model, train, test, kind="classification", recipe=recipe,
                  options=TrainOptions(steps=300, lr=3e-3), run_dir="runs/example-egt", seed=0)
result = trainer.fit()
print("test:", result.final_eval)
print("input grades after training:", model.input_grading.grades.detach().tolist())
