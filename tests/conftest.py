import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # host_reads: shared by the test folders
