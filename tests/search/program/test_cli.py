"""`graded search program` end to end (a small cap-set run) and its errors."""

import json

import pytest

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


def test_an_endpoint_that_fails_ends_the_cli_with_one_line_not_a_traceback(tmp_path, capsys):
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Refuses(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Refuses)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        code = main(["search", "program", "--problem", "cap-set", "--n", "2", "--budget", "2",
                     "--workers", "1", "--proposer", "openai", "--model", "m", "--base-url",
                     f"http://127.0.0.1:{httpd.server_address[1]}/v1",
                     "--out", str(tmp_path / "run")])
    finally:
        httpd.shutdown()
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress bar
    assert code == 2 and "Traceback" not in err  # one line and status 2, as every user error
    assert last.startswith("graded: error: the openai proposer stopped the search")
    assert "HTTP 401" in last
    assert last.endswith("no round finished, so there is nothing to resume: run the same "
                         "command again (without --resume)")
    assert main(["search", "program", "--proposer", "openai", "--model", "m", "--base-url",
                 "http://127.0.0.1:1/v1", "--max-requests", "0", "--out", str(tmp_path / "z")]) == 2
    assert "max_requests=0; expected an integer >= 1" in capsys.readouterr().err


def test_cli_map_elites_selection_runs_over_the_descriptors_given(tmp_path, capsys):
    # --selection map-elites had no way to name its descriptors: every such run was refused
    out = tmp_path / "run"
    args = ["search", "program", "--problem", "matmul", "--selection", "map-elites",
            "--descriptors", "rank,time", "--bins", "3", "--budget", "2", "--workers", "1",
            "--option", "restarts=2", "--option", "search_steps=50", "--option",
            "sparsify_steps=20", "--option", "refine_rounds=1", "--option", "refine_steps=20",
            "--out", str(out)]
    assert main(args) == 0
    assert "best score" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())["database"]
    assert config["selection"] == "map-elites"
    assert config["descriptors"] == ["rank", "time"] and config["bins"] == 3
    assert len((out / "evaluations.csv").read_text().splitlines()) == 1 + 2


@pytest.mark.slow  # searches of 7 s on 2 cores: `pytest -m slow`
def test_cli_names_descriptors_that_are_not_two_named_scores(tmp_path, capsys):
    base = ["search", "program", "--problem", "matmul", "--selection", "map-elites",
            "--budget", "2", "--workers", "1"]
    assert main([*base, "--descriptors", "rank,speed", "--out", str(tmp_path / "a")]) == 2
    assert ("map-elites descriptors ['speed'] are not named scores of the problem; expected "
            "two of ['rank', 'success', 'time']") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--descriptors", "rank", "--out", str(tmp_path / "b")])
    assert "expected two named scores A,B, got 'rank'" in capsys.readouterr().err


def test_cli_on_an_existing_run_names_the_resume_flag_not_the_python_parameter(tmp_path,
                                                                              capsys):
    # it said "pass resume=True (--resume)", the Python API's words
    out = tmp_path / "run"
    args = ["search", "program", "--problem", "cap-set", "--n", "3", "--budget", "4",
            "--workers", "2", "--islands", "2", "--out", str(out)]
    assert main(args) == 0
    before = (out / "evaluations.csv").read_text()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"graded: error: --out {out} already holds a program search run; add "
                   "--resume (with the same options) to continue it, or give another --out")
    assert (out / "evaluations.csv").read_text() == before  # nothing ran
    assert main([*args, "--resume"]) == 0  # the flag it names continues the run


def _contents(folder):
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in folder.rglob("*")}


@pytest.mark.parametrize("options, expected", [
    (["--selection", "pareto"], "pareto selection compares named scores"),
    (["--selection", "map-elites", "--descriptors", "a,b"],
     "map-elites descriptors ['a', 'b']: the problem's verifier returns one number"),
    (["--resume"], "database.json does not exist"),
])
def test_a_refused_search_writes_nothing_neither_a_new_folder_nor_into_an_old_one(
        tmp_path, capsys, options, expected):
    # the database's refusals came after config.json and run.log were written (and --resume
    # made the folder it then found empty): a refused call left a folder that looked like a run
    base = ["search", "program", "--problem", "cap-set", "--n", "3", "--budget", "2",
            "--workers", "1", *options]
    new = tmp_path / "new" / "run"
    assert main([*base, "--out", str(new)]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "notes" / "README.txt").write_text("my notes")
    before = _contents(mine)
    assert main([*base, "--out", str(mine)]) == 2
    assert expected in capsys.readouterr().err
    assert _contents(mine) == before


@pytest.mark.parametrize("flags, named", [
    (["--max-requests", "5"], "--max-requests 5"),
    (["--base-url", "http://x/v1", "--model", "m"], "--base-url http://x/v1, --model m"),
    (["--api-key-env", "KEY"], "--api-key-env KEY"),
])
def test_cli_language_model_flags_with_the_offline_proposer_are_refused(tmp_path, capsys,
                                                                         flags, named):
    # the offline proposer (the default) sends no request: these flags were ignored silently
    code = main(["search", "program", "--problem", "cap-set", "--n", "2", "--budget", "2",
                 "--workers", "1", *flags, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert (f"graded: error: {named} set the language model of --proposer openai or ensemble; "
            "--proposer offline would ignore them") in err
    assert not (tmp_path / "run").exists()
