"""The report's note on default seeds is built from what the experiments declare: each
experiment's ``default_seeds = (quick, full)`` (the counts its own ``seed_count`` call uses) and
E1's seeds per training size from its budget."""

from __future__ import annotations

import inspect
import re

import pytest

from graded.study import report
from graded.study.experiments import e1_sample_efficiency, registry
from graded.study.experiments.e3_rank import RankExperiment


def _counts(note: str) -> dict[str, int]:
    """``{experiment: count}`` read back from the note's ``"A, B and C take k"`` groups."""
    counts = {}
    for group, count in re.findall(r"((?:E[\w/]+(?:, | and )?)+) takes? (\d+)(?!\S* at)", note):
        for name in re.split(r", | and ", group):
            counts[name] = int(count)
    return counts


@pytest.mark.parametrize("quick", [True, False])
def test_note_names_each_declared_default_of_the_mode(quick):
    declared = {name: e.default_seeds[0 if quick else 1] for name, e in registry().items()
                if hasattr(e, "default_seeds")}
    assert set(declared) == {"E3", "E4/E5", "E6", "E8"}
    note = report.default_seeds_note(quick)
    assert _counts(note) == declared


def test_note_is_the_worded_default_of_each_mode():
    assert report.default_seeds_note(True) == (
        " (default of the mode: E3 takes 2; E4/E5, E6 and E8 take 3; "
        "E1 takes 2 at every training size)")
    assert report.default_seeds_note(False) == (
        " (default of the mode: E3, E4/E5, E6 and E8 take 5; E1 takes 10 at n ≤ 400 and 5 above)")


def test_changing_a_declaration_changes_the_note(monkeypatch):
    monkeypatch.setattr(RankExperiment, "default_seeds", (7, 11))
    assert _counts(report.default_seeds_note(True))["E3"] == 7
    assert _counts(report.default_seeds_note(False))["E3"] == 11
    assert "E4/E5, E6 and E8 take 5" in report.default_seeds_note(False)


def test_e1_counts_come_from_its_budget(monkeypatch):
    real = e1_sample_efficiency.budget

    def budget(quick, seeds=None):
        return {**real(quick, seeds), "small_seeds": 12, "large_seeds": 4}

    monkeypatch.setattr(e1_sample_efficiency, "budget", budget)
    assert report.default_seeds_note(False).endswith("; E1 takes 12 at n ≤ 400 and 4 above)")
    assert report.default_seeds_note(True).endswith("; E1 takes 12 at n ≤ 400 and 4 above)")


def test_every_seed_count_call_reads_its_experiments_declaration():
    """An experiment that calls seed_count passes its own ``default_seeds``, no literal counts
    the note would not see."""
    for name, experiment in registry().items():
        source = inspect.getsource(type(experiment))
        calls = re.findall(r"seed_count\(ctx, ([^)]*)\)", source)
        assert all(args == "*self.default_seeds" for args in calls), (name, calls)
        assert bool(calls) == hasattr(experiment, "default_seeds"), name


@pytest.mark.parametrize("quick", [True, False])
def test_report_states_the_declared_defaults_unless_seeds_are_given(tmp_path, monkeypatch, quick):
    from graded.study.runner import StudyRun

    monkeypatch.setattr(RankExperiment, "default_seeds", (7, 11))
    machine = dict(cpus=1, processor="cpu", platform="test", python="3", torch="2")
    for given in (False, True):
        study = StudyRun(out=tmp_path, quick=quick, seeds=4, seeds_given=given, base_seed=0,
                         workers=1, command="graded study")
        text = report.write_report(study, machine=machine).read_text(encoding="utf-8")
        if given:
            assert "Seeds: 4 (given), first seed 0." in text
        else:
            assert f"E3 takes {7 if quick else 11};" in text
            assert f"Seeds: 4{report.default_seeds_note(quick)}, first seed 0." in text
