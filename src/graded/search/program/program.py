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
import io
import re
import threading
import tokenize
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "END",
    "MAIN",
    "START",
    "Program",
    "Skeleton",
    "block_functions",
    "check_program",
    "check_seed",
    "fixed_definitions",
    "fixed_redefinitions",
    "parse_python",
    "parse_skeleton",
    "rename_function",
]

START = "# EVOLVE-BLOCK-START"
END = "# EVOLVE-BLOCK-END"

# CPython 3.11 keeps the depth counter of its AST conversion in interpreter-wide state, so
# ast.parse in two threads at once can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905); the search parses in its evaluation and proposer threads
_PARSE_LOCK = threading.Lock()

#: The statements that define a function or class (what the fixed code's names protect).
_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def check_seed(seed: object, name: str = "seed") -> int:
    """`seed` if it is an int >= 0 (numpy's generators take no negative or fractional seed and
    name neither the value nor the option); ValueError naming it otherwise."""
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"{name}={seed!r}; expected an integer >= 0")
    return seed


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, one thread at a time (the search parses from several).

    Code nested or chained too deeply for CPython's parser ("1+1+...+1" a hundred thousand
    times, "- - - ... 1") makes ``ast.parse`` raise RecursionError or MemoryError; it is
    refused here with a SyntaxError, so that every caller treats it as code that does not parse
    (a proposal is refused; the search goes on)."""
    with _PARSE_LOCK:
        try:
            return ast.parse(source)
        except (RecursionError, MemoryError) as e:
            raise SyntaxError(f"nested too deeply to parse ({type(e).__name__})") from None


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
    """Fixed text around ``len(initial.blocks)`` evolvable blocks.

    ``files`` is empty for a one-file skeleton; for a skeleton of several files it lists
    (file name, number of blocks in it) in order, and ``parts`` runs through the files in
    that order.
    """

    parts: tuple[str, ...]
    initial: Program
    files: tuple[tuple[str, int], ...] = ()

    def assemble(self, program: Program) -> str | dict[str, str]:
        """The program's source: one string, or {file name: source} for several files."""
        if len(program.blocks) != len(self.initial.blocks):
            raise ValueError(f"the skeleton has {len(self.initial.blocks)} evolvable blocks, "
                             f"the program fills {len(program.blocks)}")
        if not self.files:
            return _join(self.parts, program.blocks)
        out, p, b = {}, 0, 0
        for name, count in self.files:
            out[name] = _join(self.parts[p:p + count + 1], program.blocks[b:b + count])
            p, b = p + count + 1, b + count
        return out


def _join(parts: tuple[str, ...], blocks: tuple[str, ...]) -> str:
    out = [parts[0]]
    for block, part in zip(blocks, parts[1:], strict=True):
        body = block if block.endswith("\n") or not block else block + "\n"
        out += [START + "\n", body, END + "\n", part]
    return "".join(out)


#: The file of a several-file skeleton that holds the entry function; the others are modules
#: it imports (``import helper`` for ``helper.py``).
MAIN = "main.py"
_FILE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.py")


def parse_skeleton(source: str | Mapping[str, str]) -> Skeleton:
    """Splits ``source`` at its ``EVOLVE-BLOCK`` markers; the whole must parse as Python.

    ``source`` is one program, or several files {name: source} (AlphaEvolve): ``main.py``
    holds the entry function and imports the others; blocks may sit in any of them.
    """
    if isinstance(source, Mapping):
        if MAIN not in source:
            raise ValueError(f"a skeleton of several files needs {MAIN!r} (the file with the "
                             f"entry function); got {sorted(source)}")
        parts: list[str] = []
        blocks: list[str] = []
        files = []
        for name, text in source.items():
            if not _FILE_NAME.fullmatch(name):
                raise ValueError(f"skeleton file name {name!r}: expected a module file name "
                                 "like 'helper.py' (no folders)")
            file_parts, file_blocks = _split(text, where=f"{name}: ")
            parts += file_parts
            blocks += file_blocks
            files.append((name, len(file_blocks)))
        if not blocks:
            raise ValueError(f"the skeleton has no evolvable block (mark one with {START!r} "
                             f"and {END!r} lines)")
        reason = check_program(dict(source))
        if reason is not None:
            raise ValueError(f"the skeleton does not parse: {reason}")
        return Skeleton(tuple(parts), Program(tuple(blocks)), tuple(files))
    parts, blocks = _split(source)
    if not blocks:
        raise ValueError(f"the skeleton has no evolvable block (mark one with {START!r} "
                         f"and {END!r} lines)")
    reason = check_program(source)
    if reason is not None:
        raise ValueError(f"the skeleton does not parse: {reason}")
    return Skeleton(tuple(parts), Program(tuple(blocks)))


def _split(source: str, where: str = "") -> tuple[list[str], list[str]]:
    """The fixed parts and the blocks of one file."""
    parts: list[str] = []
    blocks: list[str] = []
    current: list[str] = []
    inside = False
    for number, line in enumerate(source.splitlines(keepends=True), start=1):
        marker = line.strip()
        if marker == START:
            if inside:
                raise ValueError(f"{where}line {number}: {START} inside an open block")
            parts.append("".join(current))
            current, inside = [], True
        elif marker == END:
            if not inside:
                raise ValueError(f"{where}line {number}: {END} without a matching {START}")
            blocks.append("".join(current))
            current, inside = [], False
        else:
            current.append(line)
    if inside:
        raise ValueError(f"{where}{START} without a matching {END}")
    parts.append("".join(current))
    return parts, blocks


def check_program(source: str | Mapping[str, str]) -> str | None:
    """None when ``source`` (or every file of it) parses, else the reason (``SyntaxError`` with
    its file and line)."""
    if isinstance(source, Mapping):
        for name, text in source.items():
            reason = check_program(text)
            if reason is not None:
                return f"{name}: {reason}"
        return None
    try:
        parse_python(source)
    except SyntaxError as e:
        return f"SyntaxError: {e.msg}" + (f" (line {e.lineno})" if e.lineno is not None else "")
    except ValueError as e:  # e.g. null bytes
        return f"ValueError: {e}"
    return None


def fixed_redefinitions(skeleton: Skeleton, program: Program) -> str | None:
    """None, or the reason why ``program`` is refused: one of its blocks binds at top level a
    name that the skeleton's fixed code defines as a function or class.

    Python keeps the last definition of a name, so a block that defines, say, its own ``pack``
    replaces the skeleton's code, and with it what the skeleton guarantees and the verifier
    cannot see (bin packing: that items are placed online, one at a time). FunSearch keeps only
    the evolved function's body of a reply; AlphaEvolve's blocks may hold anything, so here a
    block may add any new name but not rebind a fixed one. Blocks indented inside a fixed
    function or class, and several-file skeletons file by file, are handled alike. This is the
    static half of the check; :func:`fixed_definitions` gives the sandboxed child what it needs
    for the dynamic half (a rebinding through ``globals()`` or ``pack.__code__``).
    """
    if len(program.blocks) != len(skeleton.initial.blocks):
        return None  # assemble() reports this
    for name, p, b, count in _files(skeleton):
        fixed = _fixed_names(skeleton, p, b, count)
        for index in range(b, b + count):
            clash = sorted(_bound(program.blocks[index]) & fixed)
            if clash:
                where = f" of {name}" if name else ""
                return (f"block {index}{where} redefines {', '.join(map(repr, clash))}, "
                        "defined by the skeleton's fixed code; evolve only the blocks' own names")
    return None


def fixed_definitions(skeleton: Skeleton, program: Program) -> dict[str, list[list]]:
    """What the sandboxed child checks of the fixed code's functions and classes when it runs
    ``program`` (see :mod:`graded.search.program.sandbox`), per file ("" for a one-file
    skeleton): ``[name, kind, line, has_defaults]`` for each name :func:`fixed_redefinitions`
    protects, with ``kind`` "function" or "class".

    ``line`` is the line of its ``def`` or ``class`` statement in ``program``'s assembled file
    when that statement is undecorated and the fixed code binds the name nowhere else: the child
    then checks, after the module code has run, that the name holds what that statement made
    (the function of that statement's code object, with the module's globals; the one class
    built from that class body). Otherwise ``line`` is 0 and the child only checks that the
    object found after the module code is still there, unchanged, after the run. Names the
    fixed code declares ``global`` somewhere (it rebinds them itself) are left out."""
    out: dict[str, list[list]] = {}
    if len(program.blocks) != len(skeleton.initial.blocks):
        return out
    for name, p, b, count, entries in _fixed_layout(skeleton):
        moved = _part_starts(skeleton.parts[p:p + count + 1], program.blocks[b:b + count])
        if entries:
            out[name] = [[target, kind, moved[k] + offset if offset >= 0 else 0, defaults]
                         for target, kind, k, offset, defaults in entries]
    return out


@lru_cache(maxsize=16)
def _fixed_layout(skeleton: Skeleton) -> tuple:
    """For :func:`fixed_definitions`, per file: (name, first part, first block, number of
    blocks, entries), an entry being (name, kind, part k of its statement, its line's offset in
    that part or -1, whether it has default arguments). The same for every program of the
    skeleton, so parsed once."""
    out = []
    for name, p, b, count in _files(skeleton):
        parts = skeleton.parts[p:p + count + 1]
        initial = skeleton.initial.blocks[b:b + count]
        try:
            tree = parse_python(_join(parts, initial))
        except (SyntaxError, ValueError):
            continue
        fixed = _fixed_names(skeleton, p, b, count)
        fixed -= {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
        starts = _part_starts(parts, initial)
        entries = []
        for target in sorted(fixed):
            binding = [node for node in tree.body if target in _binds(node)]
            node = [n for n in binding if isinstance(n, _DEFINITIONS)][-1]
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            k = max(i for i, start in enumerate(starts) if start <= node.lineno)
            alone = len(binding) == 1 and not node.decorator_list
            offset = node.lineno - starts[k] if alone else -1
            args = getattr(node, "args", None)
            defaults = bool(args and (args.defaults or args.kw_defaults))
            entries.append((target, kind, k, offset, defaults))
        out.append((name, p, b, count, tuple(entries)))
    return tuple(out)


def _files(skeleton: Skeleton):
    """(file name, index of its first part, index of its first block, number of blocks) of each
    file of the skeleton; the one file of a one-file skeleton is named ""."""
    p = b = 0
    for name, count in skeleton.files or (("", len(skeleton.initial.blocks)),):
        yield name, p, b, count
        p, b = p + count + 1, b + count


def _fixed_names(skeleton: Skeleton, p: int, b: int, count: int) -> set[str]:
    """The functions and classes that one file's fixed code defines (its blocks' own aside)."""
    initial = skeleton.initial.blocks[b:b + count]
    fixed = _defined(_join(skeleton.parts[p:p + count + 1], initial))
    return fixed - set().union(*map(_bound, initial))


def _part_starts(parts: tuple[str, ...], blocks: tuple[str, ...]) -> list[int]:
    """The line (from 1) at which each fixed part starts in ``_join(parts, blocks)``."""
    starts = [1]
    for part, block in zip(parts[:-1], blocks, strict=True):
        body = block if block.endswith("\n") or not block else block + "\n"
        starts.append(starts[-1] + part.count("\n") + body.count("\n") + 2)  # and the markers
    return starts


def _defined(source: str) -> set[str]:
    """Functions and classes defined at the top level of ``source``."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return set()
    return {n.name for n in tree.body
            if isinstance(n, _DEFINITIONS)}


def _bound(block: str) -> set[str]:
    """Names a module-level block binds at its top level (definitions, imports, assignment and
    loop targets); nothing for a block indented inside fixed code or that does not parse."""
    first = next((line for line in block.splitlines() if line.strip()), "")
    if first[:1].isspace():
        return set()
    try:
        tree = parse_python(block)
    except (SyntaxError, ValueError):
        return set()
    return set().union(*map(_binds, tree.body))


def _binds(node: ast.stmt) -> set[str]:
    """Names one top-level statement binds (definitions, imports, assignment and loop
    targets)."""
    if isinstance(node, _DEFINITIONS):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return {n.id for n in ast.walk(node)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def block_functions(block: str) -> list[str]:
    """Names of the top-level functions a block defines."""
    tree = parse_python(block)
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def rename_function(block: str, old: str, new: str) -> str:
    """``block`` with its function ``old`` (definition and recursive calls) renamed ``new``."""
    tree = parse_python(block)

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

    try:
        return ast.unparse(Rename().visit(tree)) + "\n"
    except RecursionError:
        # ast.parse accepts deeper code than the Python-level recursion of the transformer and
        # of ast.unparse (a sum of ~600 terms): rename the tokens instead, keeping the text
        return _rename_tokens(block, old, new)


def _rename_tokens(block: str, old: str, new: str) -> str:
    """``block`` with every name token ``old`` that is not an attribute (``x.old``) renamed."""
    lines = block.splitlines(keepends=True)
    spots: list[tuple[int, int, int]] = []  # (row, start column, end column), 1-based rows
    previous = None
    for tok in tokenize.generate_tokens(io.StringIO(block).readline):
        if (tok.type == tokenize.NAME and tok.string == old
                and not (previous is not None and previous.string == ".")):
            spots.append((tok.start[0], tok.start[1], tok.end[1]))
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT):
            previous = tok
    for row, start, end in reversed(spots):
        line = lines[row - 1]
        lines[row - 1] = line[:start] + new + line[end:]
    text = "".join(lines)
    return text if text.endswith("\n") else text + "\n"
