"""graded demo: options refused before anything is written, and a report whose summary and
budget say what the demo ran (not what a fixed sentence claims)."""

from pathlib import Path

import pytest

import graded.demo as demo


def fake_results(tmp_path, values):
    """Results as the demo's runs give them, with a metrics.csv per finished run."""
    results = []
    for (task, model), vals in values.items():
        for seed, v in enumerate(vals):
            run_dir = tmp_path / "runs" / f"{task}-{model}{seed}"
            run_dir.mkdir(parents=True)
            (run_dir / "metrics.csv").write_text(
                f"step,split,name,value\n1,eval,r2,{v}\n1,train,loss,1.0\n")
            results.append({"task": task, "model": model, "seed": seed, "run_dir": str(run_dir),
                            "metric_name": "r2", "metric": v, "eval": {"r2": v},
                            "params": 10, "train_s": 1.0})
    return results


def budget(seeds, workers=1):
    return {"model_size": {"d_model": 8, "n_heads": 2, "n_layers": 1, "d_ff": 16},
            "batch_size": 4, "seeds": seeds, "steps": dict.fromkeys(demo.TASKS, 5),
            "n_train": dict.fromkeys(demo.TASKS, 9), "wall_s": 3.0, "workers": workers,
            "cpus": 2, "machine": "x", "python": "3", "quick": True}


def test_a_one_seed_report_does_not_conclude_that_grading_did_not_help(tmp_path):
    # with one seed no pair is tested ("not tested" in every verdict line), yet the summary
    # read "beat ... in 0 of 4 pairs, and lost in 0. With this budget, grading did not help
    # on these tasks."
    values = {(t, m): [0.5 + 0.1 * i] for t in demo.TASKS for i, m in enumerate(demo.MODELS)}
    baselines = {t: [{"mean": 0.0}] for t in demo.TASKS}
    text = demo.write_demo_report(tmp_path, fake_results(tmp_path, values), baselines,
                                  budget(1)).read_text()
    assert "did not help" not in text
    assert ("In short: none of the 4 (task, graded model) pairs could be compared with the "
            "ungraded transformer") in text


def test_the_summary_counts_the_pairs_compared(tmp_path):
    # LGT better on both tasks (3 seeds each); EGT failed on every run: 2 of the 2 pairs
    # compared, not "2 of 4"
    values = {}
    for t in demo.TASKS:
        values[(t, "baseline")] = [0.50, 0.52, 0.54]
        values[(t, "LGT")] = [0.80, 0.82, 0.84]
    results = fake_results(tmp_path, values)
    results += [{"task": t, "model": "EGT", "seed": 0, "run_dir": "", "error": "diverged"}
                for t in demo.TASKS]
    baselines = {t: [{"mean": 0.0}] * 3 for t in demo.TASKS}
    text = demo.write_demo_report(tmp_path, results, baselines, budget(3)).read_text()
    assert ("a graded model beat the ungraded transformer beyond two standard errors in 2 of "
            "the 2 (task, graded model) pairs compared (of 4), and lost in 0.") in text


@pytest.mark.parametrize("options, message", [
    ({"seeds": True}, r"seeds must be an int, got True"),
    ({"seeds": 1.5}, r"seeds must be an int, got 1.5"),
    ({"seeds": 0}, r"seeds must be >= 1, got 0"),
    ({"workers": True}, r"workers must be an int, got True"),
    ({"workers": 2.5}, r"workers must be an int, got 2.5"),
    ({"quick": "no"}, r"quick must be True or False, got 'no'"),
    ({"quick": 1}, r"quick must be True or False, got 1"),
])
def test_bad_options_are_refused_before_anything_is_written(tmp_path, monkeypatch, options,
                                                            message):
    # seeds=True ran one seed, workers=2.5 failed inside the pool after the output folder was
    # made, quick="no" ran the quick budget
    def no_training(*args, **kwargs):
        raise AssertionError("the demo started work")

    monkeypatch.setattr(demo, "_run_jobs", no_training)
    out = tmp_path / "demo"
    with pytest.raises((TypeError, ValueError), match=message):
        demo.run_demo(out, **{"seeds": 1, "quick": True, **options})
    assert not out.exists()


def test_an_output_path_that_is_a_file_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "_run_jobs", lambda *a: pytest.fail("the demo started work"))
    path = tmp_path / "report.md"
    path.write_text("mine")
    with pytest.raises(ValueError, match=r"output folder .*report.md' is an existing file"):
        demo.run_demo(path, seeds=1, quick=True)
    assert path.read_text() == "mine"


def test_the_report_gives_the_number_of_processes_started(tmp_path, monkeypatch):
    # --workers 16 with 6 runs started 6 processes, but the banner and the report's budget
    # said 16
    seen = {}

    def record(jobs, workers):
        seen["workers"] = workers
        return []

    def report(out_dir, results, baselines, budget):
        seen["budget"] = budget["workers"]
        return Path(out_dir) / "report.md"

    monkeypatch.setattr(demo, "_run_jobs", record)
    monkeypatch.setattr(demo, "baselines_for", lambda *a: {"mean": 0.0})
    monkeypatch.setattr(demo, "write_demo_report", report)
    demo.run_demo(tmp_path / "demo", seeds=1, quick=True, workers=16)
    runs = len(demo.TASKS) * len(demo.MODELS)
    assert seen == {"workers": runs, "budget": runs}


def test_a_model_with_fewer_finished_seeds_says_how_many_its_figure_is_over(tmp_path):
    # the intro says "mean ± sample std over 3 seeds"; LGT's figure was over the 2 that
    # finished, with nothing in its row to say so
    values = {}
    for t in demo.TASKS:
        values[(t, "baseline")] = [0.50, 0.52, 0.54]
        values[(t, "LGT")] = [0.80, 0.82]
    results = fake_results(tmp_path, values)
    results += [{"task": t, "model": "LGT", "seed": 2, "run_dir": "", "error": "diverged"}
                for t in demo.TASKS]
    baselines = {t: [{"mean": 0.0}] * 3 for t in demo.TASKS}
    text = demo.write_demo_report(tmp_path, results, baselines, budget(3)).read_text()
    assert "| LGT | 0.810 ± 0.014 (2 of 3 seeds) |" in text
    assert "| baseline | 0.520 ± 0.020 |" in text


def test_the_demo_gives_back_the_callers_torch_threads(tmp_path, monkeypatch):
    # with workers=1 every run trains in the calling process, which train_one sets to one
    # thread: a script calling run_demo was left on 1 thread
    import torch

    def one_thread_run(job):
        torch.set_num_threads(1)
        return {**{k: job[k] for k in ("task", "model", "seed")}, "error": "not trained"}

    # _run_jobs, in graded.demo_workers, looks train_one up there
    monkeypatch.setattr("graded.demo_workers.train_one", one_thread_run)
    monkeypatch.setattr(demo, "baselines_for", lambda *a: {"mean": 0.0})
    monkeypatch.setattr(demo, "write_demo_report", lambda out, *a: Path(out) / "report.md")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        demo.run_demo(tmp_path / "demo", seeds=1, quick=True, workers=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
