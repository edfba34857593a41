"""Root conftest: only what must live at the root.

The perfgate plugin is loaded through its pytest11 entry point (pip install -e .); this
file makes `fixtures/` importable for tests in every folder and loads the offload suite's
option plugin.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The offload suite's --perf-expert-file option (a plugin of its own: see that module for why).
pytest_plugins = ["fixtures.offload_option"]
