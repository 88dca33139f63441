"""Replies that repeat the skeleton: a language model asked for a function often answers with
the whole skeleton, the function filled in. :func:`~graded.search.program.proposers.
parse_function` keeps all of it, and the block then rebinds the names of the skeleton's fixed
code, which the evaluation refuses (:func:`~graded.search.program.program.fixed_redefinitions`).
:func:`trim_echo`, which the evaluation applies first, trims such a block to the code it fills
in when the skeleton's fixed code around that block is there unchanged, and otherwise says what
differed.
"""

from __future__ import annotations

from graded.search.program.program import (
    END,
    START,
    Program,
    Skeleton,
    block_functions,
    check_program,
    fixed_redefinitions,
)
from graded.search.program.proposers import ProposalError, parse_function

__all__ = ["trim_echo"]


def trim_echo(skeleton: Skeleton, program: Program) -> Program:
    """``program`` with each block that echoes the skeleton trimmed to the block it fills.

    Asked for a function, a model often answers with the whole skeleton, the function filled
    in; :func:`parse_function` keeps all of it, and the block then rebinds the names of the
    skeleton's fixed code. A block echoes when, put in the skeleton alone, it is refused so
    (:func:`~graded.search.program.program.fixed_redefinitions`) or it holds an EVOLVE-BLOCK
    marker line. It is trimmed when it holds the fixed code of its file around that file's one
    evolvable block: with the marker lines, the text between them, the text before and after
    them being the fixed code; without them, the text between the fixed code before the block,
    at the start, and the fixed code after it, at the end. Fixed code is compared line by line,
    trailing spaces and blank lines aside. The trimmed block must be what :func:`parse_function`
    gives for a reply of it alone (a module-level block) and must not itself be refused.

    Blocks that do not echo are kept. ``ProposalError`` (naming the redefinition and what
    differed) for an echo that rebinds fixed names and cannot be trimmed so; an echo that
    rebinds none and cannot be trimmed is kept, as before."""
    blocks = list(program.blocks)
    if len(blocks) != len(skeleton.initial.blocks):
        return program  # assemble() reports this
    for index, block in enumerate(blocks):
        refused = _refusal_alone(skeleton, index, block)
        marked = any(line.strip() in (START, END) for line in block.splitlines())
        if refused is None and not marked:
            continue
        try:
            blocks[index] = _trimmed(skeleton, index, block)
        except ValueError as e:
            if refused is None:
                continue
            raise ProposalError(f"{refused}; the block repeats the skeleton but cannot be "
                                f"trimmed to its own code: {e}") from None
    return Program(tuple(blocks))


def _refusal_alone(skeleton: Skeleton, index: int, block: str) -> str | None:
    """Why the skeleton's initial program with ``block`` in place ``index`` is refused."""
    alone = list(skeleton.initial.blocks)
    alone[index] = block
    return fixed_redefinitions(skeleton, Program(tuple(alone)))


def _trimmed(skeleton: Skeleton, index: int, echo: str) -> str:
    """The code of block ``index`` in ``echo``, a copy of its file (see :func:`trim_echo`);
    ``ValueError`` saying what differed or why the code is not taken."""
    before, after, after_line, of = _fixed_around(skeleton, index)
    lines = echo.splitlines(keepends=True)
    starts = [k for k, line in enumerate(lines) if line.strip() == START]
    ends = [k for k, line in enumerate(lines) if line.strip() == END]
    if starts or ends:
        if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
            raise ValueError(f"expected one {START!r} line and then one {END!r} line, got "
                             f"{len(starts)} and {len(ends)}")
        head, code, tail = lines[:starts[0]], lines[starts[0] + 1:ends[0]], lines[ends[0] + 1:]
        _same(head, 0, before, 0, of, "before the block")
        _same(tail, ends[0] + 1, after, after_line, of, "after the block")
    else:
        kept = _significant(lines)
        fixed_before = _significant(before.splitlines(keepends=True))
        fixed_after = _significant(after.splitlines(keepends=True))
        if len(kept) <= len(fixed_before) + len(fixed_after):
            raise ValueError("it holds no code besides the skeleton's fixed code")
        head_end = kept[len(fixed_before) - 1][0] + 1 if fixed_before else 0
        tail_start = kept[len(kept) - len(fixed_after)][0] if fixed_after else len(lines)
        _same(lines[:head_end], 0, before, 0, of, "before the block")
        _same(lines[tail_start:], tail_start, after, after_line, of, "after the block")
        code = lines[head_end:tail_start]
    block = "".join(code).strip("\n") + "\n"
    if not block.strip():
        raise ValueError("the block between the fixed code is empty")
    _check_trimmed(skeleton, index, block)
    return block


def _fixed_around(skeleton: Skeleton, index: int) -> tuple[str, str, int, str]:
    """The fixed code before and after block ``index``, the one block of its file, the index
    in that file of the first line after it, and the file's name in messages; ``ValueError``
    when the file holds several blocks."""
    files = skeleton.files or (("", len(skeleton.initial.blocks)),)
    p = b = 0
    for name, count in files:
        if index >= b + count:
            p, b = p + count + 1, b + count
            continue
        of = f"the skeleton's {name}" if name else "the skeleton"
        if count != 1:
            raise ValueError(f"{of} holds {count} evolvable blocks; a reply that repeats it "
                             "is not split among them")
        before = skeleton.parts[p]
        block = skeleton.initial.blocks[index]
        after_line = len(before.splitlines()) + len(block.splitlines()) + 2  # and the markers
        return before, skeleton.parts[p + 1], after_line, of
    raise IndexError(f"the skeleton has no block {index}")


def _significant(lines: list[str]) -> list[tuple[int, str]]:
    """(index, line without trailing spaces) of the non-blank ``lines``."""
    return [(k, line.rstrip()) for k, line in enumerate(lines) if line.strip()]


def _same(lines: list[str], first: int, fixed: str, fixed_first: int, of: str,
          where: str) -> None:
    """``ValueError`` naming the first line where ``lines`` of the reply's code (from its line
    index ``first``) differ from the fixed code (from line index ``fixed_first`` of ``of``, the
    skeleton or one of its files)."""
    ours = _significant(fixed.splitlines(keepends=True))
    theirs = _significant(lines)
    for (i, want), (j, got) in zip(ours, theirs, strict=False):
        if want != got:
            raise ValueError(f"the fixed code {where} differs: line {fixed_first + i + 1} of "
                             f"{of} is {want!r}, line {first + j + 1} of the reply's code "
                             f"{got!r}")
    if len(ours) > len(theirs):
        i, want = ours[len(theirs)]
        raise ValueError(f"the fixed code {where} is cut short: the reply lacks line "
                         f"{fixed_first + i + 1} of {of}, {want!r}")
    if len(theirs) > len(ours):
        j, got = theirs[len(ours)]
        raise ValueError(f"the fixed code {where} runs on: line {first + j + 1} of the reply's "
                         f"code, {got!r}, is not in {of}")


def _check_trimmed(skeleton: Skeleton, index: int, block: str) -> None:
    """``ValueError`` unless ``block`` is a block a plain reply gives: at module level, what
    :func:`parse_function` gives for it alone; and, in place ``index``, not refused."""
    initial = skeleton.initial.blocks[index]
    first = next((line for line in initial.splitlines() if line.strip()), "")
    if not first[:1].isspace():  # a module-level block, as whole-function replies give
        names = block_functions(initial) if check_program(initial) is None else []
        try:
            plain = parse_function(f"```python\n{block}```", names[0] if names else "f")
        except ProposalError as e:
            raise ValueError(f"the code between the fixed code is no plain reply: {e}") from None
        if plain != block:
            raise ValueError("the code between the fixed code is not what a plain reply of it "
                             "gives (its function is renamed)")
    reason = _refusal_alone(skeleton, index, block)
    if reason is not None:
        raise ValueError(f"the code between the fixed code is refused too: {reason}")
