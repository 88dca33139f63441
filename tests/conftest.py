import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # host_reads: shared by the test folders


#: Test folders of tiny models and many small tensor operations (batched linear algebra above
#: all), none of whose properties depends on the thread count: their tests run on one intra-op
#: thread, since on shared cores waking torch's pool for each operation costs more than the
#: operation, seconds over a test.
ONE_THREAD_FOLDERS = {"analysis", "attention", "evaluation", "morphic", "nn", "transformer"}


@pytest.fixture(autouse=True)
def _one_thread_for_tiny_models(request):
    """One intra-op thread for the tests of :data:`ONE_THREAD_FOLDERS`, the previous count
    restored after; the other tests keep torch's default."""
    folder = Path(str(request.node.path)).relative_to(Path(__file__).parent).parts[0]
    if folder not in ONE_THREAD_FOLDERS:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
