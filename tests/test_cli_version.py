"""`perfgate --version` names the installed distribution's version, as a bug report needs."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version


def test_version_prints_the_installed_distribution():
    got = subprocess.run([sys.executable, "-m", "perfgate", "--version"], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"perfgate {version('perfgate')}"
