"""Tiny tasks and models for trainer tests, also runnable as a script (subprocess/torchrun tests).

Run as a script it trains once (the torchrun test launches it on two processes).
Classification task: token sequences of length 8 over 12 symbols; the class is (sum of tokens)
mod 3. Model: embedding, dropout, mean pooling, two linear layers (dropout makes RNG state
matter). With ``--task dyck`` or ``--task polynomials``: that registered language-model task
(padded rows, different scored-token counts per row) and a one-layer transformer LM. With
``--rank-draws`` the model draws a rank-dependent count of numbers each step, so the ranks' RNG
streams (and dropout masks) differ; ``--sigint-after S`` sends SIGINT to rank
``--sigint-rank`` after step S.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

from graded.kinds import get_kind
from graded.tasks import get_task
from graded.train.options import TrainOptions
from graded.train.trainer import Trainer
from graded.transformer import TransformerConfig

VOCAB, LENGTH, CLASSES = 12, 8, 3
LM_TASKS = {"dyck": {"max_length": 12}, "polynomials": {"max_degree": 2}}
OPTIONS = {"steps": 12, "batch_size": 16, "lr": 3e-3, "eval_every": 4, "log_every": 2,
           "progress": False, "tensorboard": False, "device": "cpu", "warmup_steps": 2}


def make_data(n: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n, LENGTH), generator=gen)
    return {"inputs": x, "targets": x.sum(dim=1) % CLASSES}


class TinyClassifier(nn.Module):
    def __init__(self, dim: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.drop = nn.Dropout(dropout)
        self.hidden = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.embed(x)).mean(dim=1)
        return self.out(torch.relu(self.hidden(h)))


class RankDrawingClassifier(TinyClassifier):
    """A TinyClassifier whose training forward first draws 7 × (rank + 1) numbers: each rank's
    torch RNG stream, and so its dropout masks, is its own (as a model whose draws depend on
    its data would make them)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            torch.rand(7 * (1 + int(os.environ.get("RANK", "0"))))
        return super().forward(x)


def make_trainer(run_dir: Path, *, seed: int = 0, dropout: float = 0.1, resume_command=None,
                 rank_draws: bool = False, **options) -> Trainer:
    torch.manual_seed(seed)
    model = (RankDrawingClassifier if rank_draws else TinyClassifier)(dropout=dropout)
    return Trainer(model, make_data(96, seed + 1), make_data(48, seed + 2),
                   kind="classification", options=TrainOptions(**{**OPTIONS, **options}),
                   run_dir=run_dir, seed=seed, resume_command=resume_command)


def make_lm_trainer(run_dir: Path, task_name: str, *, seed: int = 0,
                    config: dict | None = None, **options) -> Trainer:
    """A one-layer transformer LM on 96 examples of a registered LM task (no dropout);
    ``config``: more TransformerConfig options (a grading)."""
    task = get_task(task_name, **LM_TASKS[task_name])
    train, test = task.split("random", 96, 32, seed=seed + 1)
    info = task.info()
    torch.manual_seed(seed)
    model_config = TransformerConfig(vocab_size=info["vocab_size"], d_model=16, n_heads=2,
                                     n_layers=1, d_ff=32, max_len=task.max_len,
                                     positional="learned", pad_id=info["pad_id"], **(config or {}))
    kind = get_kind(task.kind)
    return Trainer(kind.build_model(model_config, task), train.tensors, test.tensors, kind=kind,
                   options=TrainOptions(**{**OPTIONS, **options}), run_dir=run_dir, seed=seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--losses", type=Path, default=None)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--task", choices=sorted(LM_TASKS), default=None)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--no-close", action="store_true",
                        help="leave the trainer open: closed at exit (atexit)")
    parser.add_argument("--rank-draws", action="store_true",
                        help="the model draws a rank-dependent count of numbers each step")
    parser.add_argument("--pause-after", type=int, default=None)
    parser.add_argument("--resume", action="store_true", help="resume the run in run_dir")
    parser.add_argument("--sigint-after", type=int, default=None,
                        help="send SIGINT to this process after that step (on --sigint-rank); "
                             "the interruption it asks for ends with status 0")
    parser.add_argument("--sigint-rank", type=int, default=1)
    parser.add_argument("--ends", type=Path, default=None,
                        help="a folder where each rank writes the step it ended at")
    args = parser.parse_args(argv)
    common = {"steps": args.steps, "batch_size": args.batch_size, "eval_every": args.eval_every,
              "grad_accum": args.grad_accum}
    if args.task is None:
        trainer = make_trainer(args.run_dir, dropout=args.dropout, rank_draws=args.rank_draws,
                               **common)
    else:
        trainer = make_lm_trainer(args.run_dir, args.task, **common)
    if args.sigint_after is not None and trainer.ctx.rank == args.sigint_rank:
        train_step = trainer._train_step

        def step_then_signal(step: int):
            out = train_step(step)
            if step + 1 == args.sigint_after:
                os.kill(os.getpid(), signal.SIGINT)
            return out

        trainer._train_step = step_then_signal
    result = trainer.fit(resume_from=args.run_dir if args.resume else None,
                         pause_after=args.pause_after)
    if not args.no_close:
        trainer.close()
    if args.losses is not None and trainer.ctx.is_main:
        args.losses.write_text(json.dumps(result.losses))
    if args.ends is not None:
        args.ends.mkdir(exist_ok=True)
        (args.ends / f"rank{trainer.ctx.rank}.json").write_text(
            json.dumps({"step": result.step, "interrupted": result.interrupted}))
    return 130 if result.interrupted and args.sigint_after is None else 0


if __name__ == "__main__":
    sys.exit(main())
