"""Importing the package: what it costs every process that imports it (the command line, each
torchrun worker, each benchmark and sandboxed evaluation)."""

import subprocess
import sys


def test_importing_graded_leaves_torch_dynamo_unloaded():
    # torch's flex_attention module imports torch._dynamo, about a second per process start
    # on this machine: graded imports it where FlexAttention runs, not at import
    code = "import sys, graded, graded.attention.backends; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "False"
