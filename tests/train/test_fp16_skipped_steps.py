"""fp16 steps the gradient scaler skips are visible: the scale after each step is logged as
``grad_scale`` (read with the step's other values, in the one transfer of a log window), and
16 steps skipped in a row warn once, naming them, in a ``RuntimeWarning`` and a ``warning``
event of ``history.jsonl``. A run whose gradients are never finite used to skip some 165
steps silently before its scale reached 0, and the trainer read the scale from the device a
second time at each log step (``GradScaler.get_scale``)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from tiny_training import make_trainer

from graded.train.logging import read_metrics
from graded.train.runs import RunFolder

FP16 = {"warmup_steps": 0, "precision": "fp16", "eval_every": 100, "log_every": 1}
SKIPS_WARNED = 16  # graded.train.step_values.SKIPS_WARNED


def _poisoned(trainer, first_steps: int | None = None):
    """Non-finite gradients in the first ``first_steps`` backward passes (None: in all)."""
    calls = []

    def hook(grad):
        calls.append(None)
        if first_steps is None or len(calls) <= first_steps:
            return torch.full_like(grad, math.nan)
        return grad

    trainer.model.out.weight.register_hook(hook)
    return trainer


def _fit(trainer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = trainer.fit()
    return result, [str(w.message) for w in caught if w.category is RuntimeWarning]


def test_steps_skipped_in_a_row_are_logged_by_their_scale_and_warned_of_once(tmp_path):
    run = tmp_path / "run"
    steps = SKIPS_WARNED + 2
    result, warned = _fit(_poisoned(make_trainer(run, steps=steps, **FP16)))
    assert result.step == steps  # the scale is 2^-2, not yet 0: the run goes on
    # each skipped step halves torch's initial scale 2^16
    logged = read_metrics(run)["train"]["grad_scale"]
    assert logged == [(s, 2.0**16 * 0.5**s) for s in range(1, steps + 1)]
    expected = (f"the fp16 gradient scaler skipped steps 1 to {SKIPS_WARNED}, {SKIPS_WARNED} "
                "in a row: their gradients were not finite, so the optimizer did not step, "
                "and the scale fell to 1 (logged as grad_scale); ")
    assert len(warned) == 1 and warned[0].startswith(expected), warned
    assert "lower lr (now 0.003)" in warned[0]
    events = [e for e in RunFolder(run).history() if e["event"] == "warning"]
    assert [e["message"] for e in events] == warned


def test_a_few_skipped_steps_are_logged_without_a_warning(tmp_path):
    run = tmp_path / "run"
    result, warned = _fit(_poisoned(make_trainer(run, steps=5, **FP16), first_steps=3))
    assert warned == [] and result.step == 5
    # three halvings, then steps taken: the scale grows only after 2000 taken steps
    scales = [2.0**15, 2.0**14, 2.0**13, 2.0**13, 2.0**13]
    assert read_metrics(run)["train"]["grad_scale"] == list(enumerate(scales, 1))
    assert not [e for e in RunFolder(run).history() if e["event"] == "warning"]


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_a_log_window_is_read_from_the_device_once(tmp_path, precision):
    """Four steps a window: every value of them, the fp16 scale included, in one ``tolist``
    (the scale was read again by ``GradScaler.get_scale``: ``_local_scalar_dense``)."""
    from host_reads import HostReads

    trainer = make_trainer(tmp_path / "run", steps=8,
                           **{**FP16, "log_every": 4, "precision": precision})
    read = trainer._read
    sites: list[list[str]] = []

    def counted(window):
        with HostReads() as reads:
            out = read(window)
        sites.append(reads.sites)
        return out

    trainer._read = counted
    trainer.fit()
    assert len(sites) == 3  # steps 4 and 8, and the end (an empty window)
    assert [[s.split(" ")[0] for s in window] for window in sites] == [["tolist"], ["tolist"],
                                                                       []]
