"""`graded search program` end to end (a small cap-set run) and its errors."""

from graded.cli import main


def test_cli_runs_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["search", "program", "--problem", "cap-set", "--n", "3", "--budget", "4",
            "--workers", "2", "--islands", "2", "--out", str(out)]
    assert main(args) == 0
    assert "best score" in capsys.readouterr().out
    assert (out / "best.py").exists() and (out / "evaluations.csv").exists()
    assert main([*args[:6], "--budget", "8", *args[8:], "--resume"]) == 0
    assert len((out / "evaluations.csv").read_text().splitlines()) == 1 + 8


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["search", "program", "--problem", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown problem 'nope'" in capsys.readouterr().err
    assert main(["search", "program", "--proposer", "openai", "--out", str(tmp_path / "y")]) == 2
    assert "--base-url" in capsys.readouterr().err
