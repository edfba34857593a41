"""dev/gpu/vllm_import_trace.py: which carried wheels did vLLM's processes import?

Real files in a temporary pip --target layout and real `-X importtime` output of a Python
child process; the script decides the minimal wheel set for the GPU machine, so a wrong
mapping (a namespace package credited to the wrong wheel, a module missed) would drop a
wheel that `vllm serve` needs or carry one it does not.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "dev" / "gpu" / "vllm_import_trace.py"


def _dist(site: Path, name: str, files: list[str]) -> None:
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    for f in files:
        p = site / f
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("")
    (info / "RECORD").write_text("".join(f"{f},sha256=x,0\n" for f in files) + f"{info.name}/RECORD,,\n")


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    _dist(site, "regularpkg", ["regularpkg/__init__.py", "regularpkg/sub.py"])
    _dist(site, "single_module", ["single_module.py"])
    _dist(site, "ns_part", ["nsroot/part/__init__.py"])           # namespace package nsroot
    _dist(site, "other_ns_part", ["nsroot/other/__init__.py"])
    _dist(site, "never_used", ["never_used/__init__.py"])
    return site


def _trace(tmp_path: Path, site: Path, code: str, log_name: str) -> Path:
    """Run `code` in a child with -X importtime and site on the path; its stderr is the log."""
    log = tmp_path / log_name
    with open(log, "w") as fh:
        subprocess.run([sys.executable, "-X", "importtime", "-c", code], stderr=fh, check=True,
                       env={"PYTHONPATH": str(site)})
    return log


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True)


def test_imported_wheels_are_found_by_module_and_namespace_part(tmp_path):
    site = _site(tmp_path)
    _trace(tmp_path, site, "import regularpkg.sub, nsroot.part", "vllm_server.log")
    _trace(tmp_path, site, "import single_module", "bench.log")
    out = _run(site, tmp_path)
    assert out.returncode == 0, out.stderr
    used = {line.split()[1]: line.split()[2] for line in out.stdout.splitlines() if line.startswith("used")}
    unused = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("unused")}
    assert used == {"regularpkg": "server", "ns_part": "server", "single_module": "bench"}
    # the other part of the shared namespace was not imported: importing nsroot.part must not credit it
    assert unused == {"other_ns_part", "never_used"}


def test_no_import_lines_means_failure(tmp_path):
    site = _site(tmp_path)
    (tmp_path / "empty.log").write_text("INFO nothing here\n")
    out = _run(site, tmp_path / "empty.log")
    assert out.returncode == 1
    assert "0 of 5 distributions" in out.stdout
