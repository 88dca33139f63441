"""A command whose output is piped into a reader that stops early (``graded bench | head -3``)
ends quietly: no "graded: error: [Errno 32] Broken pipe", status 141 as a shell reports a
writer stopped by SIGPIPE."""

import subprocess
import sys

from graded.cli import run_command

WRITER = """
import sys
from graded.cli import run_command

def lines(args):
    for i in range(200_000):
        print("line", i)

sys.exit(run_command(lines, None))
"""


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
