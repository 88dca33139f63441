"""`redefinition`: a block that defines the skeleton's fixed `pack` is refused by the static
check; one that evades it (through `globals()`, or by assigning `pack.__code__`) and replaces the
fixed code is caught in the child, after the module code or after the run, and its artefacts are
discarded."""

import numpy as np
import pytest

from graded.search.program.evaluate import evaluate
from graded.search.program.problem import Problem, get_problem
from graded.search.program.problems.bin_packing import best_fit, count_bins, first_fit
from graded.search.program.program import (
    Program,
    fixed_definitions,
    fixed_redefinitions,
    parse_skeleton,
)


@pytest.fixture(scope="module")
def packing():
    return get_problem("bin-packing", dataset="or3", evolve_instances=2)


# An offline packer (first fit decreasing: it sees every item before placing any), which the
# verifier cannot tell from an online one; each block below smuggles it in past the static check.
_OFFLINE = '''
def offline(instance):
    capacity, items = instance["capacity"], instance["items"]
    loads, where = [], [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: -items[i]):
        for b, load in enumerate(loads):
            if load + items[i] <= capacity:
                loads[b] += items[i]
                where[i] = b
                break
        else:
            loads.append(items[i])
            where[i] = len(loads) - 1
    order = {}
    for b in where:
        order.setdefault(b, len(order))
    return [order[b] for b in where]
'''

_BEST_FIT = "def priority(item, bins):\n    return -(bins - item)\n"
# The same packer defined under the skeleton's own name: the static check's case.
_OFFLINE_PACK = _BEST_FIT + "\n\n" + _OFFLINE.lstrip("\n").replace("def offline(", "def pack(")

EVASIONS = {
    "globals() at import": _OFFLINE + _BEST_FIT + 'globals()["pack"] = offline\n',
    "globals() inside priority": _OFFLINE + '''
def priority(item, bins):
    g = globals()
    if g["pack"] is not offline:  # on its first call: every later instance packs offline
        g["pack"] = offline
    return -(bins - item)
''',
    "pack.__code__ at import": _OFFLINE + _BEST_FIT + 'pack.__code__ = offline.__code__\n',
    "def pack under an if": _OFFLINE + _BEST_FIT + """
if True:  # the static check reads only a block's top-level statements' own names
    def pack(instance):
        return offline(instance)
""",
    "pack.__code__ inside priority": _OFFLINE + '''
def priority(item, bins):
    pack.__code__ = offline.__code__
    return -(bins - item)
''',
}


def _offline_scores(problem):
    namespace = {}
    exec(_OFFLINE, namespace)
    online = [count_bins(x, best_fit(x["items"], x["capacity"])) for x in problem.inputs]
    offline = [count_bins(x, namespace["offline"](x)) for x in problem.inputs]
    return online, offline


@pytest.mark.parametrize("how", sorted(EVASIONS))
def test_a_block_that_replaces_pack_past_the_static_check_is_a_redefinition_naming_pack(
        packing, how):
    block = EVASIONS[how]
    skeleton = parse_skeleton(packing.skeleton)
    assert fixed_redefinitions(skeleton, Program((block,))) is None  # the static check passes
    online, offline = _offline_scores(packing)
    assert sum(offline) < sum(online)  # what the evasion would have scored as "online" packing
    result = evaluate(packing, Program((block,)))
    assert result.failure == "redefinition" and result.score is None
    assert "fixed function 'pack'" in result.reason
    if "inside priority" in how:
        assert "while the program ran" in result.reason


def test_the_reasons_say_when_and_what_was_replaced(packing):
    at_import = evaluate(packing, Program((EVASIONS["globals() at import"],)))
    assert at_import.reason == ("the fixed function 'pack' is not the one the fixed code "
                                "defined (once the program's module code had run)")
    replaced = evaluate(packing, Program((EVASIONS["globals() inside priority"],)))
    assert replaced.reason == "the fixed function 'pack' was replaced while the program ran"
    altered = evaluate(packing, Program((EVASIONS["pack.__code__ inside priority"],)))
    assert altered.reason == ("the fixed function 'pack' was altered while the program ran "
                              "(its __code__ was replaced)")


def _packing_score(problem, fit):
    """The problem's score of a packer, computed in this process without the sandbox."""
    scores = [-100.0 * (count_bins(x, fit(x["items"], x["capacity"])) - x["l1_bound"])
              / x["group_mean_l1"] for x in problem.inputs]
    return float(np.mean(scores))


@pytest.mark.parametrize(("block", "fit", "before"), [
    (_BEST_FIT, best_fit, -6.015037593984962),
    ("def priority(item, bins):\n    return 0.0 * bins\n", first_fit, -6.265664160401002),
])
def test_honest_blocks_score_exactly_as_before_the_check(packing, block, fit, before):
    # `before`: evaluate's score of the same block on the same inputs before the dynamic check
    result = evaluate(packing, Program((block,)))
    assert result.ok and result.score == before
    assert result.score == pytest.approx(_packing_score(packing, fit), abs=1e-12)


def test_a_block_that_adds_helpers_and_reads_the_fixed_names_still_passes(packing):
    block = ('import math\n\nSCALE = 1.0\n\n\ndef tightness(item, bins):\n'
             '    return -(bins - item) * SCALE\n\n\n'
             'def priority(item, bins):\n'
             '    assert callable(pack)  # reading a fixed name is fine\n'
             '    return tightness(item, bins) + 0.0 * math.pi\n')
    result = evaluate(packing, Program((block,)))
    assert result.ok and result.score == pytest.approx(_packing_score(packing, best_fit),
                                                       abs=1e-12)


# ---- other skeletons: several blocks, classes, decorated and self-rebinding fixed code -------

_SHAPES = '''import functools


class Box:
    def __init__(self, size):
        self.size = size


@functools.cache
def table(n):
    return list(range(n))


def scale(v):
    return v


def rescale():  # the fixed code rebinds its own function: not checked
    global scale
    scale = lambda v: 1 * v  # noqa: E731


# EVOLVE-BLOCK-START
def weight(x):
    return x
# EVOLVE-BLOCK-END


def solve(n):
    rescale()
    return [scale(weight(Box(v).size)) for v in table(n)]
'''


def _shapes(block):
    problem = Problem(name="shapes", skeleton=_SHAPES, entry="solve", inputs=(3,),
                      score=lambda n, a: float(sum(a)), time_limit_s=10.0, memory_mb=512)
    return evaluate(problem, Program((block,)))


def test_fixed_classes_and_decorated_functions_are_checked_and_honest_code_passes():
    skeleton = parse_skeleton(_SHAPES)
    entries = {e[0]: e for e in fixed_definitions(skeleton, skeleton.initial)[""]}
    lines = _SHAPES.splitlines()
    assert entries["Box"][1:3] == ["class", lines.index("class Box:") + 1]
    assert entries["table"][2] == 0  # decorated: checked from after the module code on
    assert entries["solve"][1:3] == ["function", lines.index("def solve(n):") + 1]
    assert "scale" not in entries and "rescale" in entries  # `global scale`: left out
    assert _shapes("def weight(x):\n    return 2 * x\n").score == 6.0


@pytest.mark.parametrize(("block", "name"), [
    ('class Fake:\n    def __init__(self, size):\n        self.size = 10 * size\n\n\n'
     'globals()["Box"] = Fake\n\n\ndef weight(x):\n    return x\n', "class 'Box'"),
    ('def weight(x):\n    globals()["table"] = lambda n: [9] * n\n    return x\n',
     "function 'table'"),
    ('def weight(x):\n    solve.__defaults__ = (1,)\n    return x\n', "function 'solve'"),
])
def test_a_replaced_class_or_decorated_function_is_a_redefinition(block, name):
    result = _shapes(block)
    assert result.failure == "redefinition" and name in result.reason


def test_a_fixed_helper_of_another_file_is_checked_in_its_module():
    skeleton = {
        "main.py": "import helper\n# EVOLVE-BLOCK-START\ndef g(x):\n    return x\n"
                   "# EVOLVE-BLOCK-END\ndef entry(x):\n    return helper.fixed(g(x))\n",
        "helper.py": "def fixed(x):\n    return x + 1\n"}
    problem = Problem(name="files", skeleton=skeleton, entry="entry", inputs=(1,),
                      score=lambda x, a: float(a), time_limit_s=10.0, memory_mb=512)
    assert evaluate(problem, parse_skeleton(skeleton).initial).score == 2.0
    evasion = "def g(x):\n    helper.fixed.__code__ = (lambda x: 100).__code__\n    return x\n"
    result = evaluate(problem, Program((evasion,)))
    assert result.failure == "redefinition" and "'fixed' of helper.py" in result.reason


def test_a_block_that_redefines_the_skeletons_packer_is_refused_not_scored_as_online():
    # The verifier can check a packing but not that it was made online; a block that defines
    # its own `pack` replaces the skeleton's online loop. Run directly, that offline packing
    # beats best fit by far, which is what the search used to report for "online" packing.
    from graded.search.program.problems.bin_packing import count_bins

    problem = get_problem("bin-packing", dataset="or3", evolve_instances=1)
    instance = problem.inputs[0]
    namespace = {}
    exec(problem.skeleton, namespace)
    online = count_bins(instance, namespace["pack"](instance))
    exec(_OFFLINE_PACK, namespace)
    offline = count_bins(instance, namespace["pack"](instance))
    assert offline < online  # the redefinition would have looked like a better heuristic
    result = evaluate(problem, Program((_OFFLINE_PACK,)))
    assert result.failure == "redefinition" and result.score is None
    assert "block 0 redefines 'pack'" in result.reason
