"""Skeletons, evolvable blocks and programs: parsing and re-assembly through ``ast``.

A skeleton marks its evolvable regions with comment lines::

    # EVOLVE-BLOCK-START
    def priority(el, n):
        return 0.0
    # EVOLVE-BLOCK-END

:func:`parse_skeleton` splits it into fixed text and blocks; a :class:`Program` is the tuple of
block sources that fills them, and :meth:`Skeleton.assemble` puts them back. Every assembled
program must parse (``ast.parse``); :func:`check_program` returns the reason when it does not.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass

__all__ = [
    "END",
    "START",
    "Program",
    "Skeleton",
    "block_functions",
    "check_program",
    "parse_skeleton",
    "rename_function",
]

START = "# EVOLVE-BLOCK-START"
END = "# EVOLVE-BLOCK-END"


@dataclass(frozen=True)
class Program:
    """The sources of a skeleton's evolvable blocks, in order."""

    blocks: tuple[str, ...]

    @property
    def length(self) -> int:
        """Characters in the blocks (FunSearch prefers shorter programs within a cluster)."""
        return sum(len(b) for b in self.blocks)

    @property
    def key(self) -> str:
        """A stable hash of the blocks, used to skip programs already evaluated."""
        return hashlib.sha256("\0".join(self.blocks).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Skeleton:
    """Fixed text around ``len(initial.blocks)`` evolvable blocks."""

    parts: tuple[str, ...]
    initial: Program

    def assemble(self, program: Program) -> str:
        if len(program.blocks) != len(self.initial.blocks):
            raise ValueError(f"the skeleton has {len(self.initial.blocks)} evolvable blocks, "
                             f"the program fills {len(program.blocks)}")
        out = [self.parts[0]]
        for block, part in zip(program.blocks, self.parts[1:], strict=True):
            body = block if block.endswith("\n") or not block else block + "\n"
            out += [START + "\n", body, END + "\n", part]
        return "".join(out)


def parse_skeleton(source: str) -> Skeleton:
    """Splits ``source`` at its ``EVOLVE-BLOCK`` markers; the whole must parse as Python."""
    parts: list[str] = []
    blocks: list[str] = []
    current: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if marker == START:
            if inside:
                raise ValueError(f"line {number}: {START} inside an open block")
            parts.append("".join(current))
            current, inside = [], True
        elif marker == END:
            if not inside:
                raise ValueError(f"line {number}: {END} without a matching {START}")
            blocks.append("".join(current))
            current, inside = [], False
        else:
            current.append(line)
    if inside:
        raise ValueError(f"{START} without a matching {END}")
    if not blocks:
        raise ValueError(f"the skeleton has no evolvable block (mark one with {START!r} "
                         f"and {END!r} lines)")
    parts.append("".join(current))
    reason = check_program(source)
    if reason is not None:
        raise ValueError(f"the skeleton does not parse: {reason}")
    return Skeleton(tuple(parts), Program(tuple(blocks)))


def check_program(source: str) -> str | None:
    """None when ``source`` parses, else the reason (``SyntaxError`` with its line)."""
    try:
        ast.parse(source)
    except SyntaxError as e:
        return f"SyntaxError: {e.msg} (line {e.lineno})"
    except ValueError as e:  # e.g. null bytes
        return f"ValueError: {e}"
    return None


def block_functions(block: str) -> list[str]:
    """Names of the top-level functions a block defines."""
    tree = ast.parse(block)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def rename_function(block: str, old: str, new: str) -> str:
    """``block`` with its function ``old`` (definition and recursive calls) renamed ``new``."""
    tree = ast.parse(block)

    class Rename(ast.NodeTransformer):
        def visit_FunctionDef(self, node):
            self.generic_visit(node)
            if node.name == old:
                node.name = new
            return node

        def visit_Name(self, node):
            if node.id == old:
                node.id = new
            return node

    return ast.unparse(Rename().visit(tree)) + "\n"
