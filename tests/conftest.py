import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # host_reads: shared by the test folders


@pytest.fixture
def one_thread():
    """One intra-op thread for the test, the previous count restored after. For tests of many
    small tensor operations (batched linear algebra above all), whose property does not depend
    on the thread count: on shared cores, waking torch's pool for each operation costs more than
    the operation, seconds over a test."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
