"""`graded report` of a run training for the first time (its lock held by the trainer, no
metrics.json until the run ends) names the process training it, rather than calling the
folder "not a finished run folder" as it does a folder that is no run at all."""

from __future__ import annotations

from test_cli_runs import held_lock

from graded.cli import main


def _error_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_report_of_a_first_run_in_training_names_its_process(tmp_path, capsys):
    run = tmp_path / "runs" / "first"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: first\n")  # as train writes it before step 1
    with held_lock(run) as pid:
        assert main(["report", str(run)]) == 2
    assert _error_line(capsys.readouterr().err) == (
        f"graded: error: run folder {run} is being trained by process {pid} and has no "
        "metrics.json until that run ends (or is interrupted); report it then")
    assert not (run / "report").exists()


def test_report_of_a_folder_no_process_holds_is_still_not_a_finished_run(tmp_path, capsys):
    run = tmp_path / "first"
    run.mkdir()
    (run / "config.yaml").write_text("name: first\n")
    assert main(["report", str(run)]) == 2
    assert _error_line(capsys.readouterr().err) == (
        "graded: error: not finished run folders (no metrics.json), nor folders holding "
        f"finished runs: [{str(run)!r}]")
