"""graded._io.atomic_write_text: the permissions of a plain write, a durable rename (the folder
synced), symbolic links written through, and nothing left behind on an error or Ctrl-C."""

import os
import stat
from pathlib import Path

import pytest

from graded import _io


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def plain_write_mode(folder, name="plain.txt"):
    """The mode ``open(path, "w")`` gives a new file in ``folder`` under the current umask."""
    with open(folder / name, "w") as fh:
        fh.write("x")
    return mode_of(folder / name)


@pytest.mark.parametrize("umask, folder_mode", [(0o077, 0o755), (0o002, 0o700), (0o022, 0o755)])
def test_a_new_file_has_the_mode_a_plain_write_gives_under_the_umask(tmp_path, umask,
                                                                     folder_mode):
    # the mode came from the folder's bits: under umask 077 (private files) a file in a 0755
    # folder was made 0644, readable by everyone; under umask 002 a 0700 folder gave 0600
    folder = tmp_path / "run"
    folder.mkdir()
    folder.chmod(folder_mode)
    old = os.umask(umask)
    try:
        _io.atomic_write_text(folder / "config.yaml", "a: 1\n")
        expected = plain_write_mode(folder)
    finally:
        os.umask(old)
    assert expected == 0o666 & ~umask
    assert mode_of(folder / "config.yaml") == expected
    assert (folder / "config.yaml").read_text() == "a: 1\n"


def test_a_replaced_file_keeps_its_whole_mode_execute_bits_included(tmp_path):
    # a plain write keeps the mode of the file it writes; the execute bits were dropped (0755
    # became 0644)
    script = tmp_path / "run.sh"
    script.write_text("echo old\n")
    script.chmod(0o750)
    _io.atomic_write_text(script, "echo new\n")
    assert mode_of(script) == 0o750
    assert script.read_text() == "echo new\n"


def test_the_folder_is_synced_after_the_rename(tmp_path, monkeypatch):
    # only the file was synced: after a power cut the rename could be lost (the old file back)
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append((stat.S_ISDIR(os.fstat(fd).st_mode), os.path.exists(tmp_path / "a.json")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    _io.atomic_write_text(tmp_path / "a.json", "{}")
    assert synced[0] == (False, False)  # the temporary file, before the rename
    assert (True, True) in synced  # the folder, after it


def test_a_symbolic_link_is_written_through_and_stays_a_link(tmp_path):
    # os.replace put a regular file in place of the link and left its target as it was
    target = tmp_path / "shared" / "config.yaml"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "config.yaml"
    link.symlink_to(target)
    _io.atomic_write_text(link, "new")
    assert link.is_symlink()
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize("error", [KeyboardInterrupt, OSError])
def test_an_interrupted_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch,
                                                                      error):
    path = tmp_path / "metrics.json"
    _io.atomic_write_text(path, "old")

    def interrupted(fd):
        raise error("stopped while syncing")

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(error):
        _io.atomic_write_text(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_text_that_cannot_be_encoded_writes_nothing(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        _io.atomic_write_text(tmp_path / "a.txt", "bad \udc80 surrogate")
    assert list(tmp_path.iterdir()) == []


def test_bytes_are_written_as_given(tmp_path):
    data = bytes(range(256)) * 300
    _io.atomic_write_bytes(tmp_path / "blob.bin", data)
    assert (tmp_path / "blob.bin").read_bytes() == data


def test_an_error_making_the_temporary_file_names_the_file_asked_for(tmp_path):
    """A folder that takes no new file (here /proc, which no one may create files in) made the
    error name the temporary file (".x.json.ed8cdcc3.tmp"), a name the caller never gave."""
    target = Path("/proc/x.json")
    if not Path("/proc").is_dir():
        pytest.skip("no /proc")
    with pytest.raises(OSError) as exc:
        _io.atomic_write_bytes(target, b"{}")
    assert exc.value.filename == str(target) and ".tmp" not in str(exc.value)
    assert not any(p.name.endswith(".tmp") for p in Path("/proc").iterdir())
