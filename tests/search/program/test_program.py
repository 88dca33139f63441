"""Skeleton parsing, re-assembly and evaluation with cascade and verifier failures."""

import ast

import pytest

from graded.search.program.database import DatabaseConfig, ProgramsDatabase
from graded.search.program.evaluate import Evaluation, evaluate
from graded.search.program.problem import InvalidArtefact, Problem, get_problem
from graded.search.program.program import (
    Program,
    check_program,
    parse_skeleton,
    rename_function,
)

TWO_BLOCKS = '''import math

# EVOLVE-BLOCK-START
def a(x):
    return x
# EVOLVE-BLOCK-END


def run(x):
    return b(a(x))

# EVOLVE-BLOCK-START
def b(y):
    return y + 1
# EVOLVE-BLOCK-END
'''


def test_blocks_are_split_and_reassembled_exactly():
    skeleton = parse_skeleton(TWO_BLOCKS)
    assert len(skeleton.initial.blocks) == 2
    assert skeleton.assemble(skeleton.initial) == TWO_BLOCKS
    changed = Program(("def a(x):\n    return 2 * x\n", skeleton.initial.blocks[1]))
    assert "return 2 * x" in skeleton.assemble(changed)
    with pytest.raises(ValueError, match="2 evolvable blocks"):
        skeleton.assemble(Program(("x = 1\n",)))


@pytest.mark.parametrize("source,message", [
    ("def f():\n    pass\n", "no evolvable block"),
    ("# EVOLVE-BLOCK-START\nx = 1\n", "without a matching"),
    ("# EVOLVE-BLOCK-END\n", "without a matching"),
    ("# EVOLVE-BLOCK-START\nx = (\n# EVOLVE-BLOCK-END\n", "does not parse"),
])
def test_bad_skeletons_are_refused(source, message):
    with pytest.raises(ValueError, match=message):
        parse_skeleton(source)


def strict(x, artefact):
    if artefact != 2 * x + 1:
        raise InvalidArtefact(f"expected {2 * x + 1}, got {artefact!r}")
    return float(artefact)


def nan_score(x, artefact):
    return float("nan")


def problem(score=strict, prechecks=()):
    return Problem("two", TWO_BLOCKS, "run", (1, 3), score, prechecks=prechecks,
                   held_out=(10,), time_limit_s=5.0, memory_mb=512)


def test_evaluate_scores_with_the_verifier_and_names_failures():
    skeleton = parse_skeleton(TWO_BLOCKS)
    good = Program(("def a(x):\n    return 2 * x\n", skeleton.initial.blocks[1]))
    result = evaluate(problem(), good, held_out=True)
    assert result.ok and result.signature == (3.0, 7.0) and result.score == 5.0
    assert result.held_out["mean"] == 21.0
    assert evaluate(problem(), skeleton.initial).failure == "invalid"
    bad = Program(("def a(x:\n", skeleton.initial.blocks[1]))
    result = evaluate(problem(), bad)
    assert result.failure == "syntax" and "SyntaxError" in result.reason
    assert evaluate(problem(nan_score), good).failure == "non_finite"


@pytest.mark.slow  # 5 s on 2 cores: `pytest -m slow`
def test_cascade_stops_at_a_failing_precheck():
    skeleton = parse_skeleton(TWO_BLOCKS)
    slow_on_big = Program(("def a(x):\n    if x > 50:\n        while True:\n            pass\n"
                           "    return 2 * x\n", skeleton.initial.blocks[1]))
    result = evaluate(problem(prechecks=(100,)), slow_on_big)
    assert result.failure == "timeout" and "(precheck)" in result.reason


def test_registry_names_known_problems():
    with pytest.raises(ValueError, match="cap-set"):
        get_problem("cap_set")


@pytest.mark.parametrize("name", ["cap-set", "bin-packing", "matmul"])
def test_registry_refuses_an_option_the_problem_does_not_take(name):
    with pytest.raises(ValueError, match=rf"unknown option\(s\) \['sizee'\] for problem '{name}'"):
        get_problem(name, sizee=3)


def test_registry_passes_options_to_a_factory_that_takes_any(monkeypatch):
    from graded.search.program import problem as registry

    get_problem("cap-set")  # the shipped problems registered before the registry is copied
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    seen = {}

    def factory(**options):
        seen.update(options)
        return get_problem("cap-set", n=2)

    registry.register_problem("test-any-options", factory)
    get_problem("test-any-options", colour="red")
    assert seen == {"colour": "red"}


FILES = {
    "main.py": "import helper\n\n\ndef run(x):\n    return helper.scale(x) + 1\n",
    "helper.py": ("FACTOR = 1\n\n# EVOLVE-BLOCK-START\ndef scale(x):\n    return FACTOR * x\n"
                  "# EVOLVE-BLOCK-END\n"),
}


def test_several_files_parse_assemble_and_run_in_the_sandbox():
    skeleton = parse_skeleton(FILES)
    assert skeleton.files == (("main.py", 0), ("helper.py", 1))
    assert skeleton.assemble(skeleton.initial) == FILES
    problem = Problem("files", FILES, "run", (1, 3), strict, time_limit_s=5.0, memory_mb=512)
    assert evaluate(problem, skeleton.initial).failure == "invalid"  # x + 1, not 2x + 1
    good = Program(("def scale(x):\n    return 2 * x\n",))
    result = evaluate(problem, good)
    assert result.ok and result.signature == (3.0, 7.0)
    broken = Program(("def scale(x:\n",))
    result = evaluate(problem, broken)
    assert result.failure == "syntax" and "helper.py" in result.reason


def test_several_file_skeletons_are_checked():
    with pytest.raises(ValueError, match=r"main\.py"):
        parse_skeleton({"helper.py": FILES["helper.py"]})
    with pytest.raises(ValueError, match="no folders"):
        parse_skeleton({"main.py": FILES["main.py"], "pkg/helper.py": FILES["helper.py"]})
    with pytest.raises(ValueError, match="no evolvable block"):
        parse_skeleton({"main.py": FILES["main.py"]})


def test_evaluating_a_program_that_forges_its_result_file_reports_a_failure():
    # a wrong number of artefacts used to reach the verifier's zip and come back as a
    # misnamed "non_finite"; a non-object result used to raise in the parent
    for written, failure in (('{"artefacts": []}', "wrong_type"), ("[0]", "wrong_type"),
                             ('{"artefacts": [NaN]}', "non_finite")):
        skeleton = ("import os\n# EVOLVE-BLOCK-START\ndef g(x):\n    return x\n"
                    "# EVOLVE-BLOCK-END\n"
                    f"def entry(x):\n    open('result.json', 'w').write({written!r})\n"
                    "    os._exit(0)\n")
        problem = Problem(name="forge", skeleton=skeleton, entry="entry", inputs=(1,),
                          score=lambda x, a: float(a), time_limit_s=10.0, memory_mb=512)
        result = evaluate(problem, parse_skeleton(skeleton).initial)
        assert result.failure == failure and result.score is None


def test_a_block_may_add_helpers_and_imports_of_its_own():
    problem = get_problem("cap-set", n=2)
    block = ("import numpy as np\n\n\ndef weight(el):\n    return 1.0\n\n\n"
             "def priority(el, n):\n    return weight(el)\n")
    result = evaluate(problem, Program((block,)))
    assert result.ok and result.score == 2.0**2  # a constant priority gives {0, 1}^n


def test_redefinitions_are_checked_file_by_file_in_a_several_file_skeleton():
    from graded.search.program.program import fixed_redefinitions

    skeleton = parse_skeleton({
        "main.py": "import helper\n# EVOLVE-BLOCK-START\ndef g(x):\n    return x\n"
                   "# EVOLVE-BLOCK-END\ndef entry(x):\n    return helper.h(g(x))\n",
        "helper.py": "def fixed(x):\n    return x\n# EVOLVE-BLOCK-START\ndef h(x):\n"
                     "    return fixed(x)\n# EVOLVE-BLOCK-END\n"})
    assert fixed_redefinitions(skeleton, skeleton.initial) is None
    g, h = skeleton.initial.blocks
    # `fixed` lives in helper.py: main.py may use the name, helper.py may not rebind it
    assert fixed_redefinitions(skeleton, Program((g + "fixed = 0\n", h))) is None
    reason = fixed_redefinitions(skeleton, Program((g, h + "fixed = 0\n")))
    assert reason.startswith("block 1 of helper.py redefines 'fixed'")
    assert "redefines 'entry'" in fixed_redefinitions(
        skeleton, Program((g + "def entry(x):\n    return 0\n", h)))


# ---- code nested deeper than CPython's parser or ast.unparse take -----------------------------

_TOO_DEEP = [
    "def priority(el, n):\n    return 1" + " + 1" * 100_000 + "\n",  # RecursionError in ast
    "def priority(el, n):\n    return " + "-" * 100_000 + "1\n",  # MemoryError in the parser
]


@pytest.mark.parametrize("block", _TOO_DEEP)
def test_a_program_too_deep_to_parse_is_a_syntax_failure_not_an_exception(block):
    # ast.parse raises RecursionError / MemoryError here, not SyntaxError: these used to escape
    # evaluate() (through trim_echo) and stop the whole search
    assert "nested too deeply" in check_program(block)
    out = evaluate(get_problem("cap-set", n=2), Program((block,)))
    assert out.failure == "syntax" and "nested too deeply" in out.reason


def test_renaming_a_function_too_deep_for_ast_unparse_renames_its_name_tokens():
    # 800 chained additions parse and run, but the transformer and ast.unparse recurse deeper
    # than Python's limit: the prompt of a database holding such a program used to raise
    block = ("def priority(el, n):\n    return priority.calls + "
             + " + ".join(["el[0]"] * 800) + "\n")
    assert check_program(block) is None
    renamed = rename_function(block, "priority", "priority_v0")
    assert renamed == block.replace("priority", "priority_v0")  # no other occurrence
    short = "def priority(el, n):\n    return priority.calls + el[0] + el[1]\n"
    assert rename_function(short, "priority", "priority_v0") == ast.unparse(
        ast.parse(short.replace("priority", "priority_v0"))) + "\n"
    parent = Evaluation(Program((block,)), 1.0, (1.0,))
    db = ProgramsDatabase(DatabaseConfig(islands=1), parent)
    island, parents = db.sample()
    assert "def priority_v0(el, n):" in db.prompt(island, parents).text
