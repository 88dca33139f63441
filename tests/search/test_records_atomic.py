"""PatternBoost's records are written by the library's one atomic write
(:func:`graded._io.atomic_write_bytes`): a failed write leaves the old file and no temporary
file, and a replaced file keeps its mode. (records.py had a copy of its own that wrote to a
fixed ``<name>.tmp``, left it behind on an error and gave a replaced file the umask's mode.)"""

import errno
import os
import stat

import pytest

from graded import _io
from graded.search.patternboost import records


def test_records_write_with_the_shared_atomic_write():
    assert records.atomic_write_bytes is _io.atomic_write_bytes


@pytest.mark.parametrize("fail_at", ["fsync", "replace"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, monkeypatch,
                                                                     fail_at):
    path = tmp_path / "state.json"
    records.write_json(path, {"round": 1})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, fail_at, disk_full)
    with pytest.raises(OSError, match="No space left"):
        records.write_json(path, {"round": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["state.json"]
    assert records.read_json(path) == {"round": 1}


def test_a_replaced_record_keeps_its_mode(tmp_path):
    path = tmp_path / "metrics.csv"
    records.write_csv(path, [{"round": 0, "best": 1.0}])
    os.chmod(path, 0o600)
    records.write_csv(path, [{"round": 1, "best": 2.0}])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().splitlines()[1].startswith("1,")
    assert os.listdir(tmp_path) == ["metrics.csv"]
