import pytest


@pytest.fixture(autouse=True)
def _on_one_thread(one_thread):
    """Every test here on one intra-op thread (``one_thread`` in tests/conftest.py): their
    models are tiny, and no property here depends on the thread count."""
