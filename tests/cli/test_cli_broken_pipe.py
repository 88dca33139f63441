"""A command whose output is piped into a reader that stops early (``graded bench | head -3``)
ends quietly: no "graded: error: [Errno 32] Broken pipe", status 141 as a shell reports a
writer stopped by SIGPIPE."""

import subprocess
import sys

import pytest

from graded.cli import run_command

WRITER = """
import sys
from graded.cli import run_command

def lines(args):
    for i in range(200_000):
        print("line", i)

sys.exit(run_command(lines, None))
"""


@pytest.mark.slow  # a CLI process into a closed pipe (3 s on 2 cores): `pytest -m slow`
def test_a_reader_that_stops_early_ends_the_command_quietly():
    writer = subprocess.Popen([sys.executable, "-c", WRITER], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    assert writer.stdout.readline() == b"line 0\n"
    writer.stdout.close()  # the reader goes away, as head does after its lines
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=60) == 141
    assert err == ""


def test_a_broken_pipe_raised_by_a_command_returns_141_without_an_error_line(capsys):
    def handler(args):
        raise BrokenPipeError(32, "Broken pipe")

    assert run_command(handler, None) == 141
    assert capsys.readouterr().err == ""


OTHER_PIPE = """
import os, sys
from graded.cli import run_command

def feed_a_dead_worker(args):
    print("started", flush=True)
    read, write = os.pipe()
    os.close(read)  # the worker at the other end is gone
    os.write(write, b"job")

sys.exit(run_command(feed_a_dead_worker, None))
"""


def test_a_broken_pipe_that_is_not_the_output_is_an_error():
    """A pipe other than the output breaking (a worker process that died) is an error, reported
    as one with status 2, while the output's reader is still there: it used to end the
    command quietly with status 141, as if the output's reader had stopped."""
    writer = subprocess.run([sys.executable, "-c", OTHER_PIPE], capture_output=True,
                            timeout=60)
    assert writer.stdout == b"started\n"
    assert writer.returncode == 2
    assert writer.stderr.decode() == "graded: error: [Errno 32] Broken pipe\n"
