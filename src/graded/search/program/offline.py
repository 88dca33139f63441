"""The offline proposer: genetic programming on the syntax tree of the evolvable blocks.

It needs no language model, so every search runs on a machine without network. A child is made
from the prompt's parents (sorted by increasing score; the last is the best) by one operator,
drawn uniformly from :data:`OPERATORS`:

- ``constant``: a numeric constant c becomes c + δ, c·f or a fresh small value
  (δ ∈ {±1, ±0.5}, f ∈ {0.5, 2, −1});
- ``operator``: a binary operator is swapped for another of + − * / // % ** (or a unary
  − / not is toggled);
- ``comparison``: a comparison operator is swapped for another of < <= > >= == !=;
- ``subexpression``: an expression is replaced by a random expression built from the block's
  own names, numbers and sub-expressions, with + − * /, ``abs``, ``min``/``max``, ``len``,
  ``sum`` and subscripts (grammar in :meth:`OfflineProposer._random_expression`);
- ``insert``: a copy of a statement of a function body (not a return), or a new guarded early
  return ``if e1 <cmp> e2: return e3`` of random expressions, is inserted into the body;
- ``delete``: a statement that is not the last of its body is removed;
- ``crossover``: a statement (or, with several blocks, a whole block) of the best parent is
  replaced by the corresponding one of another parent.

Children that do not parse, equal a parent, or were proposed before are discarded and drawn
again (up to ``attempts`` times). Everything is driven by one ``numpy`` generator, so a seed fixes
the proposals.
"""

from __future__ import annotations

import ast
import copy

import numpy as np

from graded.search.program.engine import NoNewProgram
from graded.search.program.program import Program, check_seed, parse_python

__all__ = ["OPERATORS", "OfflineProposer"]

OPERATORS = ("constant", "operator", "comparison", "subexpression", "insert", "delete",
             "crossover")

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_CMPOPS = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)


def _numbers(tree: ast.AST) -> list[ast.Constant]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)]


def _expressions(tree: ast.AST) -> list[tuple[ast.AST, str, int | None]]:
    """(parent, field, index) of every expression slot that may be replaced (not targets,
    not function names in calls, not keyword names)."""
    slots = []
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if isinstance(parent, ast.Call) and name == "func":
                continue
            if isinstance(value, ast.expr) and not isinstance(value.ctx if hasattr(
                    value, "ctx") else None, ast.Store):
                slots.append((parent, name, None))
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, ast.expr) and not isinstance(getattr(
                            item, "ctx", None), ast.Store):
                        slots.append((parent, name, i))
    return slots


def _replaceable(tree: ast.AST) -> list[tuple[ast.AST, str, int | None]]:
    """Expression slots other than string constants (docstrings, messages)."""
    return [s for s in _expressions(tree) if not (isinstance(_get(*s), ast.Constant)
                                                   and isinstance(_get(*s).value, str))]


def _get(parent, field, index):
    value = getattr(parent, field)
    return value if index is None else value[index]


def _set(parent, field, index, node):
    if index is None:
        setattr(parent, field, node)
    else:
        getattr(parent, field)[index] = node


def _bodies(tree: ast.AST) -> list[list[ast.stmt]]:
    out = []
    for node in ast.walk(tree):
        for name in ("body", "orelse"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt) and not \
                    isinstance(node, ast.Module):
                out.append(body)
    return out


class OfflineProposer:
    """Proposes children of the prompt's parents by AST mutation and crossover."""

    name = "offline"

    def __init__(self, *, seed: int = 0, attempts: int = 50,
                 operators: tuple[str, ...] = OPERATORS) -> None:
        unknown = set(operators) - set(OPERATORS)
        if unknown or not operators:
            raise ValueError(f"operators={operators!r}; expected a non-empty subset of {OPERATORS}")
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            # 0 made every proposal fail mid-run, 2.5 a TypeError in `range`
            raise ValueError(f"attempts={attempts!r}; expected an integer >= 1")
        self.rng = np.random.default_rng(check_seed(seed))
        self.attempts = attempts
        self.operators = tuple(operators)
        self.seen: set[str] = set()

    # state for exact resume
    def state(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "seen": sorted(self.seen)}

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.seen = set(state["seen"])

    def propose(self, parents: list[Program], prompt: str = "") -> tuple[Program, str]:
        """A new program and the operator that made it; raises
        :class:`~graded.search.program.engine.NoNewProgram` when no valid new child was found
        in ``attempts`` draws (the search then draws other parents)."""
        for p in parents:
            self.seen.add(p.key)
        for _ in range(self.attempts):
            op = self.operators[int(self.rng.integers(len(self.operators)))]
            child = self._apply(op, parents)
            if child is None or child.key in self.seen:
                continue
            self.seen.add(child.key)
            return child, op
        raise NoNewProgram(f"no new valid program after {self.attempts} attempts")

    def _apply(self, op: str, parents: list[Program]) -> Program | None:
        best = parents[-1]
        b = int(self.rng.integers(len(best.blocks)))
        if op == "crossover":
            if len(parents) < 2:
                return None
            other = parents[int(self.rng.integers(len(parents) - 1))]
            if len(best.blocks) > 1:
                blocks = list(best.blocks)
                blocks[b] = other.blocks[b]
                return Program(tuple(blocks))
            tree = self._crossover(parse_python(best.blocks[b]), parse_python(other.blocks[b]))
        else:
            tree = parse_python(best.blocks[b])
            tree = getattr(self, f"_{op}")(tree)
        if tree is None:
            return None
        try:
            ast.fix_missing_locations(tree)
            source = ast.unparse(tree) + "\n"
            compile(source, "<block>", "exec")
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return None
        blocks = list(best.blocks)
        blocks[b] = source
        return Program(tuple(blocks))

    # -- operators -------------------------------------------------------------------------------
    def _choice(self, items):
        return items[int(self.rng.integers(len(items)))] if items else None

    def _constant(self, tree):
        node = self._choice(_numbers(tree))
        if node is None:
            return None
        kind = int(self.rng.integers(3))
        if kind == 0:
            node.value = node.value + float(self._choice([-1, 1, -0.5, 0.5]))
        elif kind == 1:
            node.value = node.value * float(self._choice([0.5, 2.0, -1.0]))
        else:
            node.value = int(self.rng.integers(-3, 4)) if self.rng.random() < 0.5 else \
                round(float(self.rng.normal()), 3)
        if isinstance(node.value, float) and node.value.is_integer() and abs(node.value) < 1e6:
            node.value = float(node.value)
        return tree

    def _operator(self, tree):
        binops = [n for n in ast.walk(tree) if isinstance(n, ast.BinOp)]
        node = self._choice(binops)
        if node is None:
            return None
        options = [o for o in _BINOPS if not isinstance(node.op, o)]
        node.op = self._choice(options)()
        return tree

    def _comparison(self, tree):
        compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)]
        node = self._choice(compares)
        if node is None:
            return None
        i = int(self.rng.integers(len(node.ops)))
        node.ops[i] = self._choice([o for o in _CMPOPS if not isinstance(node.ops[i], o)])()
        return tree

    def _subexpression(self, tree):
        slots = _replaceable(tree)
        slot = self._choice(slots)
        if slot is None:
            return None
        pool = [copy.deepcopy(_get(*s)) for s in slots]
        names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                        and isinstance(n.ctx, ast.Load)} | {
            a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) for a in f.args.args})
        depth = int(self.rng.integers(1, 4))
        _set(*slot, self._random_expression(names, pool, depth=depth))
        return tree

    def _random_expression(self, names: list[str], pool: list[ast.expr], depth: int) -> ast.expr:
        """Grammar: leaf = name | number (an integer 1…7 or one of 0, ½, 1, 2, 3, −1) | name[i]
        (i ∈ −2…2) | existing sub-expression;
        expr = leaf | expr (+ − * / %) expr | abs(expr) | min(expr, expr) | max(expr, expr)
        | len(name) | sum(name)."""
        r = self.rng.random()
        if depth == 0 or r < 0.35:
            k = int(self.rng.integers(4))
            if k == 0 and names:
                return ast.Name(self._choice(names), ast.Load())
            if k == 1 and names:
                return ast.Subscript(ast.Name(self._choice(names), ast.Load()),
                                     ast.Constant(int(self.rng.integers(-2, 3))), ast.Load())
            if k == 2 and pool:
                return copy.deepcopy(self._choice(pool))
            if self.rng.random() < 0.5:
                return ast.Constant(int(self.rng.integers(1, 8)))
            return ast.Constant(float(self._choice([0.0, 0.5, 1.0, 2.0, 3.0, -1.0])))
        if r < 0.75:
            op = self._choice([ast.Add, ast.Sub, ast.Mult, ast.Mult, ast.Div, ast.Mod])()
            return ast.BinOp(self._random_expression(names, pool, depth - 1), op,
                             self._random_expression(names, pool, depth - 1))
        fn = self._choice(["abs", "min", "max", "len", "sum"])
        if fn in ("len", "sum") and names:
            argument = ast.Name(self._choice(names), ast.Load())
            return ast.Call(ast.Name(fn, ast.Load()), [argument], [])
        args = [self._random_expression(names, pool, depth - 1)]
        if fn in ("min", "max"):
            args.append(self._random_expression(names, pool, depth - 1))
        return ast.Call(ast.Name(fn if fn not in ("len", "sum") else "abs", ast.Load()), args, [])

    def _insert(self, tree):
        body = self._choice(_bodies(tree))
        if body is None:
            return None
        copies = [s for s in body if not isinstance(s, (ast.Return, ast.Expr))]
        if copies and self.rng.random() < 0.5:
            stmt = copy.deepcopy(self._choice(copies))
        else:  # a guarded early return: if a <cmp> b: return expr
            slots = _expressions(tree)
            pool = [copy.deepcopy(_get(*s)) for s in slots]
            names = sorted({a.arg for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                            for a in f.args.args})
            test = ast.Compare(self._random_expression(names, pool, 1),
                               [self._choice(_CMPOPS)()], [self._random_expression(names, pool, 1)])
            stmt = ast.If(test, [ast.Return(self._random_expression(names, pool, 2))], [])
        body.insert(int(self.rng.integers(len(body))), stmt)
        return tree

    def _delete(self, tree):
        bodies = [b for b in _bodies(tree) if len(b) > 1]
        body = self._choice(bodies)
        if body is None:
            return None
        del body[int(self.rng.integers(len(body) - 1))]
        return tree

    def _crossover(self, tree, donor):
        mine = [b for b in _bodies(tree)]
        theirs = [s for b in _bodies(donor) for s in b]
        body = self._choice(mine)
        if body is None or not theirs:
            return None
        body[int(self.rng.integers(len(body)))] = copy.deepcopy(self._choice(theirs))
        return tree
