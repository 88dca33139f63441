import signal
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # host_reads: shared by the test folders


def pytest_configure(config):
    """Python's own SIGINT handler, even where the run inherited SIGINT ignored: a shell without
    job control starts a background command (``make test &`` in a script) that way, and Python
    keeps an inherited ``SIG_IGN``, so the tests that interrupt themselves, which check what
    Ctrl-C does in a terminal, would wait out the work they interrupt."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


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
