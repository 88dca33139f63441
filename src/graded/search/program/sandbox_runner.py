"""The program a sandboxed child runs: ``runner.py`` in the child's private directory.

:data:`RUNNER` is its source text. :class:`~graded.search.program.sandbox.Sandbox` writes it
into the child's directory and starts ``python -I runner.py <preimport modules>``. The child
imports those modules (a spare started ahead of time does this while it waits), then waits for
``go`` on stdin; it reads ``request.json`` (``entry``, ``inputs``, ``fixed``), runs
``candidate.py`` in a namespace of its own and calls ``entry(input)`` for each input. It writes
``result.json``: ``{"artefacts": [...]}`` (one per input, ``tolist()`` of arrays), or
``{"failure": <a name of FAILURES>, "reason": <text>}`` for a crash, a ``MemoryError``, a
non-finite or non-JSON artefact, or a ``redefinition`` of the skeleton's fixed functions and
classes (checked after the module code and again after the run).

It is text, not a module of this package: the child runs in isolated mode, with none of this
package on its path, and imports only the standard library and the preimport modules.
"""

__all__ = ["RUNNER"]

RUNNER = r'''
import errno, json, math, sys, traceback

def _finite(x):
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, (list, tuple)):
        return all(_finite(v) for v in x)
    if isinstance(x, dict):
        return all(_finite(v) for v in x.values())
    return True

def _write(payload):
    with open("result.json", "w") as f:
        json.dump(payload, f, allow_nan=False)

import os

def _fixed_guard(fixed, namespace, code):
    # Trusted: set up before the candidate runs. `fixed`: {file: [[name, kind, line,
    # has_defaults]]} ("" or "main.py": the candidate's own namespace, compiled as `code`).
    # Returns check(ran) -> None or why a fixed function or class is not the fixed code's.
    import builtins, types
    FunctionType, CodeType = types.FunctionType, types.CodeType  # as they are before it runs
    modules = {}
    for file in fixed:
        if file in ("", "main.py"):
            modules[file] = (lambda: namespace), code.co_consts, True
        else:
            with open(file) as f:
                consts = compile(f.read(), file, "exec").co_consts
            modules[file] = (lambda m=file[:-3]: getattr(sys.modules.get(m), "__dict__", None),
                             consts, False)
    expected, classes = {}, {}
    for file, entries in fixed.items():
        for name, kind, line, _ in entries:
            expected[file, name] = next(
                (c for c in modules[file][1] if isinstance(c, CodeType)
                 and c.co_name == name and c.co_firstlineno == line), None) if line else None
            if kind == "class" and expected[file, name] is not None:
                classes[file, name] = []
    if classes:  # every class built from a fixed class body, to tell the fixed class apart
        original = builtins.__build_class__
        def build_class(func, name, *bases, **kw):
            made = original(func, name, *bases, **kw)
            for key in classes:
                if getattr(func, "__code__", None) == expected[key]:
                    classes[key].append(made)
            return made
        builtins.__build_class__ = build_class
    missing, seen = object(), {}

    def state(obj):  # what must not change during the run
        if type(obj) is not FunctionType:
            return (obj,)  # a class, or what a decorator made of a fixed function
        kw = obj.__kwdefaults__
        return (obj, obj.__code__, obj.__defaults__, kw, obj.__globals__,
                *(tuple(kw.items()) if type(kw) is dict else ()))

    def defined(file, name, kind, line, has_defaults, obj, where):
        if obj is missing:
            return False
        if not line:
            return True  # decorated or bound twice: found now, checked from now on
        ref = expected[file, name]
        if kind == "class":
            return len(classes[file, name]) == 1 and classes[file, name][0] is obj
        if ref is None or type(obj) is not FunctionType:
            return False
        same = obj.__code__ is ref or (not modules[file][2] and obj.__code__ == ref)
        return (same and obj.__globals__ is where
                and obj.__closure__ is None
                and (has_defaults or (obj.__defaults__ is None and obj.__kwdefaults__ is None)))

    def check(ran):
        for file, entries in fixed.items():
            of = " of " + file if file not in ("", "main.py") else ""
            where = modules[file][0]()
            if where is None:
                continue  # a module of the program not imported (yet)
            if type(where) is not dict:
                return f"the module{of} is not the fixed code's"
            for name, kind, line, has_defaults in entries:
                obj = where.get(name, missing)
                before = seen.get((file, name))
                if before is None:
                    try:
                        ok = defined(file, name, kind, line, has_defaults, obj, where)
                    except Exception:
                        ok = False
                    if not ok:
                        when = ("after the run" if ran else
                                "once the program's module code had run")
                        return (f"the fixed {kind} {name!r}{of} is not the one the fixed code "
                                f"defined ({when})")
                    seen[file, name] = state(obj)
                    continue
                now = state(obj) if obj is before[0] else (obj,)
                if now[0] is not before[0]:
                    return f"the fixed {kind} {name!r}{of} was replaced while the program ran"
                for attr, old, new in zip(("__code__", "__defaults__", "__kwdefaults__",
                                           "__globals__"), before[1:5], now[1:5]):
                    if old is not new:
                        return (f"the fixed {kind} {name!r}{of} was altered while the program "
                                f"ran (its {attr} was replaced)")
                if len(now) != len(before) or any(
                        a[0] is not b[0] or a[1] is not b[1] for a, b in zip(now[5:], before[5:])):
                    return (f"the fixed {kind} {name!r}{of} was altered while the program ran "
                            "(its __kwdefaults__ were changed)")
        return None
    return check

def main():
    for name in sys.argv[1:]:
        try:
            __import__(name)
        except ImportError:
            pass
    if sys.stdin.readline().strip() != "go":
        import shutil
        shutil.rmtree(os.getcwd(), ignore_errors=True)  # a spare that was never used
        return
    request = json.load(open("request.json"))
    sys.path.insert(0, os.getcwd())  # the other files of a several-file program
    namespace = {"__name__": "candidate"}
    try:
        code = compile(open("candidate.py").read(), "candidate.py", "exec")
        check = _fixed_guard(request.get("fixed") or {}, namespace, code)
        exec(code, namespace)
        redefined = check(False)
        if redefined is not None:
            _write({"failure": "redefinition", "reason": redefined})
            return
        entry = namespace[request["entry"]]
        artefacts = []
        for value in request["inputs"]:
            artefact = entry(value)
            if hasattr(artefact, "tolist"):
                artefact = artefact.tolist()
            artefacts.append(artefact)
        redefined = check(True)
        if redefined is not None:  # the artefacts may not be the fixed code's: discarded
            _write({"failure": "redefinition", "reason": redefined})
            return
    except MemoryError:
        _write({"failure": "memory", "reason": "MemoryError"})
        return
    except RecursionError as e:
        _write({"failure": "crash", "reason": "RecursionError: " + str(e)[:200]})
        return
    except BaseException as e:
        if isinstance(e, OSError) and e.errno == errno.EFBIG:
            # CPython ignores SIGXFSZ: a write past RLIMIT_FSIZE (a print flood) is this error
            _write({"failure": "output", "reason": "file-size limit reached (stdout, stderr or "
                    "a file the program wrote): " + str(e)[:200]})
            return
        tb = traceback.format_exc(limit=-3)
        _write({"failure": "crash", "reason": type(e).__name__ + ": " + str(e)[:300],
                "traceback": tb[-2000:]})
        return
    try:  # RecursionError: an artefact that holds itself, or nested past the recursion limit
        if not _finite(artefacts):
            _write({"failure": "non_finite", "reason": "an artefact contains NaN or infinity"})
            return
        text = json.dumps({"artefacts": artefacts}, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as e:
        _write({"failure": "wrong_type", "reason": "artefact is not JSON: "
                + (str(e)[:200] if not isinstance(e, RecursionError) else
                   "it contains itself or is nested too deeply (RecursionError)")})
        return
    with open("result.json", "w") as f:
        f.write(text)

main()
'''
