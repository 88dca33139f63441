"""A run folder's ``config.yaml`` reads back as the config written: strings the library's
reader would take for numbers (a run named ``1e3`` from ``1e3.yaml``) stay strings, so such a
run can be resumed, evaluated and reported."""

import pytest

from graded.config import read_config_file
from graded.train.runs import CONFIG_FILE, RunFolder


@pytest.mark.parametrize("name", ["1e3", "-.5", ".5e3", "08", "010", "1:30", "on", "null", "é"])
def test_a_run_folders_config_yaml_reads_back_as_the_config_written(tmp_path, name):
    config = {"name": name, "seed": 0, "train": {"lr": 0.001, "steps": 3},
              "task": {"name": "dyck", "tags": [name]}}
    run = RunFolder(tmp_path / "run")
    assert run.write_config(config)
    assert read_config_file(tmp_path / "run" / CONFIG_FILE) == config
