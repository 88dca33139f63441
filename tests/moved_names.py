"""What a module split off another defines itself, for the tests that check the old module
still gives the same objects (tests/ is on the path: conftest.py)."""

from types import ModuleType


def own_names(module: ModuleType) -> set[str]:
    """The names ``module`` defines (their ``__module__`` is it) or exports (``__all__``)."""
    return {n for n, v in vars(module).items()
            if getattr(v, "__module__", None) == module.__name__
            or n in getattr(module, "__all__", ())}
