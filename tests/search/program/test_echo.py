"""A reply that repeats the skeleton (a language model's whole-program answer) is trimmed to
its block when the fixed code around it is unchanged, and otherwise refused naming what
differed (graded.search.program.echo)."""

import pytest

from graded.search.program.echo import trim_echo
from graded.search.program.program import Program, parse_skeleton
from graded.search.program.proposers import OpenAIProposer, ProposalError

ECHO_SKELETON = '''"""Runs f on rounded inputs."""
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

NEW_F = "def f(x):\n    # twice, then one\n    return 2 * x + 1\n"


def _echo(function=NEW_F, markers=True, skeleton=ECHO_SKELETON):
    """The skeleton with its block replaced by ``function``, with or without the markers."""
    head, rest = skeleton.split("# EVOLVE-BLOCK-START\n")
    tail = rest.split("# EVOLVE-BLOCK-END\n")[1]
    if markers:
        return f"{head}# EVOLVE-BLOCK-START\n{function}# EVOLVE-BLOCK-END\n{tail}"
    return head + function + tail


@pytest.mark.parametrize("reply", [
    _echo(),
    f"Here is the whole program:\n```python\n{_echo()}```\nIt doubles x.",
    f"```python\n{_echo(markers=False)}```",
    _echo(markers=False),
    f"```py\n{_echo().replace(chr(10) * 3, chr(10) * 2)}```",  # blank lines aside
], ids=["echo", "fenced_echo", "fenced_without_markers", "without_markers", "fewer_blanks"])
def test_a_reply_repeating_the_skeleton_is_trimmed_to_what_a_plain_reply_gives(reply):
    from graded.search.program.program import fixed_redefinitions, parse_skeleton

    skeleton = parse_skeleton(ECHO_SKELETON)
    echoed = OpenAIProposer.parse(reply, skeleton.initial)
    assert fixed_redefinitions(skeleton, echoed) is not None  # refused as it stands
    plain = OpenAIProposer.parse(f"```python\n{NEW_F}```", skeleton.initial)
    assert plain == Program((NEW_F,))
    assert trim_echo(skeleton, echoed) == plain
    assert trim_echo(skeleton, plain) == plain  # a plain reply is kept


@pytest.mark.parametrize(("reply", "differed"), [
    (_echo().replace("math.floor(x)", "math.ceil(x)"),
     r"the fixed code before the block differs: line 10 of the skeleton is "
     r"'    return math.floor\(x\)', line 10 of the reply's code '    return math.ceil\(x\)'"),
    (_echo().replace("    assert y >= 0\n", ""),
     r"the fixed code after the block differs: line 20 of the skeleton is "
     r"'    assert y >= 0', line 21 of the reply's code '    return y'"),
    (_echo() + "\nprint(run(3))\n",
     r"the fixed code after the block runs on: line 24 of the reply's code, "
     r"'print\(run\(3\)\)', is not in the skeleton"),
    (_echo().replace("import math\n", ""),
     r"the fixed code before the block differs: line 2 of the skeleton is 'import math', "
     r"line 4 of the "
     r"reply's code 'def run\(x\):'"),
    (_echo(markers=False).replace("check(y)", "check(z)"),
     r"the fixed code after the block differs: line 19 of the skeleton is "
     r"'def check\(y\):', line 18 of the reply's code 'def check\(z\):'"),
    (_echo(NEW_F + "# EVOLVE-BLOCK-END\n"),
     r"expected one '# EVOLVE-BLOCK-START' line and then one '# EVOLVE-BLOCK-END' line, got "
     r"1 and 2"),
    (_echo("def f_v1(x):\n    return x\n"),
     r"the code between the fixed code is not what a plain reply of it gives \(its function "
     r"is renamed\)"),
    (_echo("def helper(x):\n    return x\n\n\ndef f(x):\n    return helper(x)\n"),
     r"the code between the fixed code is refused too: block 0 redefines 'helper'"),
], ids=["altered_before", "altered_after", "added_after", "missing_import",
        "altered_without_markers", "two_end_markers", "renamed_function", "redefines_inside"])
def test_a_repeated_skeleton_whose_fixed_code_differs_is_refused_naming_the_difference(
        reply, differed):
    from graded.search.program.program import parse_skeleton

    skeleton = parse_skeleton(ECHO_SKELETON)
    echoed = Program((reply,))
    with pytest.raises(ProposalError, match=r"^block 0 redefines 'check', 'helper', 'run', "
                       r"defined by the skeleton's fixed code; .*; the block repeats the "
                       r"skeleton but cannot be trimmed to its own code: " + differed):
        trim_echo(skeleton, echoed)


def test_an_evaluated_echo_scores_as_its_function_and_an_altered_one_is_a_redefinition():
    from graded.search.program.evaluate import evaluate
    from graded.search.program.problem import get_problem
    from graded.search.program.program import parse_skeleton

    problem = get_problem("bin-packing", dataset="or3", evolve_instances=1)
    worst_fit = ("def priority(item, bins):\n    \"\"\"Worst fit.\"\"\"\n"
                 "    return bins - item\n")
    echo = _echo(worst_fit, skeleton=problem.skeleton)
    reply = f"The program, with a new priority:\n```python\n{echo}```\n"
    best_fit = parse_skeleton(problem.skeleton).initial
    plain = OpenAIProposer.parse(f"```python\n{worst_fit}```", best_fit)
    result = evaluate(problem, OpenAIProposer.parse(reply, best_fit))
    expected = evaluate(problem, plain)
    assert result.ok and result.program == plain == Program((worst_fit,))
    assert result.score == expected.score != evaluate(problem, best_fit).score
    altered = OpenAIProposer.parse(reply.replace("opened += 1", "opened += 2"), best_fit)
    refused = evaluate(problem, altered)
    assert refused.failure == "redefinition" and refused.program == altered
    assert refused.reason.startswith("block 0 redefines 'pack'")
    assert refused.reason.endswith("the fixed code before the block differs: line 28 of the "
                                   "skeleton is '            opened += 1', line 28 of the "
                                   "reply's code '            opened += 2'")


def test_a_repeated_file_of_a_several_file_skeleton_is_trimmed_only_where_it_has_one_block():
    from graded.search.program.program import parse_skeleton

    helper = ("def fixed(x):\n    return x\n# EVOLVE-BLOCK-START\ndef h(x):\n"
              "    return fixed(x)\n# EVOLVE-BLOCK-END\n")
    two = ("import helper\n# EVOLVE-BLOCK-START\ndef g(x):\n    return x\n"
           "# EVOLVE-BLOCK-END\ndef entry(x):\n    return helper.h(k(g(x)))\n"
           "# EVOLVE-BLOCK-START\ndef k(x):\n    return x\n# EVOLVE-BLOCK-END\n")
    skeleton = parse_skeleton({"main.py": two, "helper.py": helper})
    g, k, h = skeleton.initial.blocks
    new_h = "def h(x):\n    return fixed(x) + 1\n"
    echoed = Program((g, k, _echo(new_h, skeleton=helper)))
    assert trim_echo(skeleton, echoed) == Program((g, k, new_h))
    with pytest.raises(ProposalError, match=r"block 0 of main.py redefines 'entry'.*: the "
                       r"skeleton's main.py holds 2 evolvable blocks; a reply that repeats it "
                       r"is not split among them"):
        trim_echo(skeleton, Program((two, k, h)))
    altered = _echo(new_h, skeleton=helper.replace("return x", "return -x"))
    with pytest.raises(ProposalError, match=r"block 2 of helper.py redefines 'fixed'.*: the "
                       r"fixed code before the block differs: line 2 of the skeleton's "
                       r"helper.py is '    return x', line 2 of the reply's code "
                       r"'    return -x'"):
        trim_echo(skeleton, Program((g, k, altered)))


def test_a_repeated_skeleton_without_fixed_functions_is_trimmed_by_its_markers():
    """Nothing is redefined when the fixed code holds no function or class; the marker lines
    still show a repeated skeleton, trimmed when its fixed code is there, kept otherwise (as
    before: the block binds no fixed function name)."""
    from graded.search.program.program import parse_skeleton

    source = "import math\nLIMIT = 3\n# EVOLVE-BLOCK-START\ndef f(x):\n    return x\n" \
             "# EVOLVE-BLOCK-END\n"
    skeleton = parse_skeleton(source)
    echo = Program((_echo(NEW_F, skeleton=source),))
    assert trim_echo(skeleton, echo) == Program((NEW_F,))
    changed = Program((_echo(NEW_F, skeleton=source.replace("LIMIT = 3", "LIMIT = 4")),))
    assert trim_echo(skeleton, changed) == changed


REFUSED = r"^block 0 redefines 'check', 'helper', 'run', .*cannot be trimmed to its own code: "


def test_a_program_of_another_block_count_is_left_alone():
    skeleton = parse_skeleton(ECHO_SKELETON)
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
        trim_echo(parse_skeleton(ECHO_SKELETON), Program((reply,)))
