import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory) -> Path:
    """A finished run of the tiny trainer with checkpoints at steps 4 and 8, one per test
    module (never modified: tests use copies)."""
    from tiny_training import make_trainer

    from graded.train import checkpoint as ck

    folder = tmp_path_factory.mktemp("run")
    make_trainer(folder, steps=8).fit()
    assert ck.CheckpointManager(folder / "checkpoints").steps() == [4, 8]
    return folder
