"""A run recorded by an earlier version with a device this version refuses (``cpu:5``, which
those versions took) is still read by the commands that work on finished runs."""

from __future__ import annotations

import yaml
from cli_configs import tiny_config

from graded.cli import main


def test_eval_generate_and_report_read_a_run_recorded_with_device_cpu_5(tmp_path, capsys):
    assert main(["train", str(tiny_config(tmp_path, device="cpu"))]) == 0
    run = tmp_path / "runs" / "tiny"
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    recorded["train"]["device"] = "cpu:5"  # as an earlier version wrote it
    (run / "config.yaml").write_text(yaml.safe_dump(recorded, sort_keys=False))
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    assert "train.device='cpu:5'" in capsys.readouterr().err
    assert main(["generate", str(run), "--prompt", "( [", "--max-new-tokens", "2"]) == 0
    assert main(["report", str(run), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").is_file()
    # the record is left as it was: reading a run writes nothing into its config
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["device"] == "cpu:5"
