"""Echo trimming: the refusals no other test reaches, each naming what differed, and a program
of the wrong number of blocks left to assemble() to report."""

import pytest

from graded.search.program.echo import trim_echo
from graded.search.program.program import Program, parse_skeleton
from graded.search.program.proposers import ProposalError

SKELETON = '''"""Runs f on rounded inputs."""
import math


def run(x):
    return check(f(helper(x)))


def helper(x):
    return math.floor(x)


# EVOLVE-BLOCK-START
def f(x):
    return x
# EVOLVE-BLOCK-END


def check(y):
    assert y >= 0
    return y
'''


def _echo(function):
    head, rest = SKELETON.split("# EVOLVE-BLOCK-START\n")
    tail = rest.split("# EVOLVE-BLOCK-END\n")[1]
    return f"{head}# EVOLVE-BLOCK-START\n{function}# EVOLVE-BLOCK-END\n{tail}"


REFUSED = r"^block 0 redefines 'check', 'helper', 'run', .*cannot be trimmed to its own code: "


def test_a_program_of_another_block_count_is_left_alone():
    skeleton = parse_skeleton(SKELETON)
    program = Program(("def f(x):\n    return 1\n", "x = 2\n"))
    assert trim_echo(skeleton, program) is program


@pytest.mark.parametrize("reply, differed", [
    (_echo("def f(x):\n    return 2 * x\n").removesuffix("    return y\n"),
     r"the fixed code after the block is cut short: the reply lacks line 21 of the skeleton, "
     r"'    return y'"),
    (_echo(""), r"the block between the fixed code is empty"),
    (_echo("x = 1\n"), r"the code between the fixed code is no plain reply: the reply defines "
                       r"no function"),
], ids=["cut_short", "empty_block", "no_function"])
def test_an_echo_that_cannot_be_trimmed_is_refused_naming_why(reply, differed):
    with pytest.raises(ProposalError, match=REFUSED + differed):
        trim_echo(parse_skeleton(SKELETON), Program((reply,)))
