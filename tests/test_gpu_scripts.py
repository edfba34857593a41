"""The scripts that carry vLLM to a GPU machine without a package index, run for real offline.

dev/gpu/fetch_vllm_gpu_wheels.sh downloads vLLM's wheels with pip and cuts them into pieces;
dev/gpu/vllm_gpu_carry.sh joins the pieces on the GPU machine, checks the tar's SHA256 and
installs. Both had no test, and the fetch script always failed (ROOT used before it was set).
Here pip itself runs, with ``--no-index`` and a local folder of wheels named exactly as the
script pins them (tiny but valid wheels), so the whole path -- download, the set check, tar,
split, MANIFEST, stash, join, checksum, install -- runs as on a user's machine.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FETCH = ROOT / "dev" / "gpu" / "fetch_vllm_gpu_wheels.sh"
CARRY = ROOT / "dev" / "gpu" / "vllm_gpu_carry.sh"


def _pins(set_name: str = "MINIMAL") -> list[tuple[str, str]]:
    """(name, version) of vllm and of every package in one of the script's arrays."""
    text = FETCH.read_text()
    body = re.search(rf"^{set_name}=\((.*?)^\)", text, re.S | re.M).group(1)
    pins = re.findall(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.\-]+)", body)
    return [("vllm", re.search(r"vllm==([\w.]+)", text).group(1))] + pins


def _wheel(folder: Path, name: str, version: str) -> None:
    """A minimal valid pure-Python wheel: what pip needs to download and install it."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    files = {f"{dist}/__init__.py": "", f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: perfgate-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for path, body in {**files, f"{info}/RECORD": record}.items():
            z.writestr(path, body)


@pytest.fixture
def offline_index(tmp_path: Path) -> Path:
    index = tmp_path / "index"
    index.mkdir()
    for name, version in _pins():
        _wheel(index, name, version)
    return index


def _checkout(tmp_path: Path, git: bool) -> Path:
    repo = tmp_path / ("repo" if git else "plain")
    (repo / "dev" / "gpu").mkdir(parents=True)
    for script in (FETCH, CARRY):
        shutil.copy2(script, repo / "dev" / "gpu" / script.name)
    (repo / "README.md").write_text("a checkout\n")
    if git:
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    return repo


def _fetch(repo: Path, index: Path, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               **env}
    return subprocess.run(["bash", str(repo / "dev" / "gpu" / FETCH.name), "minimal", f"{sys.executable} -m pip"],
                          cwd=repo, env=environ, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_fetch_pieces_then_stash_join_and_install(tmp_path, offline_index):
    repo = _checkout(tmp_path, git=True)
    got = _fetch(repo, offline_index, PIECE_BYTES="20000")
    assert got.returncode == 0, got.stdout + got.stderr
    pieces = sorted((repo / ".vllm-carry").glob("p*"))
    assert len(pieces) >= 2, got.stdout
    manifest = dict(line.split("=", 1) for line in (pieces[0] / "MANIFEST").read_text().split())
    assert int(manifest["pieces"]) == len(pieces) and len(manifest["sha256"]) == 64
    assert "/.vllm-carry/" in (repo / ".git" / "info" / "exclude").read_text()  # never committed
    store, target = tmp_path / "store", tmp_path / "site"
    env = {**os.environ, "VLLM_CARRY_STORE": str(store)}
    for piece in pieces:
        subprocess.run(["bash", str(CARRY), "stash", str(piece)], env=env, check=True, capture_output=True)
    out = subprocess.run(["bash", str(CARRY), "install", str(target)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SHA256" in out.stdout and "ok" in out.stdout
    assert list(target.glob("vllm-*.dist-info")), sorted(p.name for p in target.iterdir())
    assert len(list(target.glob("*.dist-info"))) == len(_pins())


def test_carry_refuses_a_missing_piece_and_a_bad_checksum(tmp_path, offline_index):
    repo = _checkout(tmp_path, git=True)
    assert _fetch(repo, offline_index, PIECE_BYTES="20000").returncode == 0
    pieces = sorted((repo / ".vllm-carry").glob("p*"))
    store = tmp_path / "store"
    env = {**os.environ, "VLLM_CARRY_STORE": str(store)}
    subprocess.run(["bash", str(CARRY), "stash", str(pieces[0])], env=env, check=True, capture_output=True)
    out = subprocess.run(["bash", str(CARRY), "install", str(tmp_path / "site")], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "carry the missing ones" in out.stderr
    for piece in pieces[1:]:
        subprocess.run(["bash", str(CARRY), "stash", str(piece)], env=env, check=True, capture_output=True)
    last = sorted(store.glob("wheels.tar.part*"))[-1]
    last.write_bytes(last.read_bytes()[:-1] + b"X")
    out = subprocess.run(["bash", str(CARRY), "install", str(tmp_path / "site")], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "SHA256 mismatch" in out.stderr


def test_fetch_outside_a_git_checkout_says_so_and_works(tmp_path, offline_index):
    repo = _checkout(tmp_path, git=False)
    got = _fetch(repo, offline_index, PIECE_BYTES="50000")
    assert got.returncode == 0, got.stdout + got.stderr
    assert "not a git checkout" in got.stderr
    assert list((repo / ".vllm-carry").glob("p01/wheels.tar.part*"))


def test_fetch_refuses_a_bad_piece_size(tmp_path, offline_index):
    got = _fetch(_checkout(tmp_path, git=True), offline_index, PIECE_BYTES="lots")
    assert got.returncode == 2 and "PIECE_BYTES" in got.stderr


def test_server_start_message_quotes_this_machine_once_it_has_started_one(tmp_path):
    """The start message said '30-90 s on 2 CPU cores' on a 16-core H200 host (real: 83-129 s): it
    now names both kinds before the first start and this session's own starts after."""
    from fixtures.serving import ServerPool

    pool = ServerPool(tmp_path, progress=lambda text: None)
    first = pool._expected_start()
    assert "2 CPU cores" in first and "H200" in first
    pool._starts_s += [83.0, 129.0]
    assert pool._expected_start() == "/health took 83-129 s for this session's 2 earlier start(s)"


SESSION = ROOT / "dev" / "gpu" / "gpu_serving_session.sh"
FAKE_PYTHON = """#!/bin/bash
# stands in for the GPU image's python3: logs its argv, and plays pytest with the exit code asked for
echo "$*" >> "$FAKE_LOG"
case "$*" in
  *"-m pytest"*) [ -n "$FAKE_PYTEST_SLEEP" ] && sleep "$FAKE_PYTEST_SLEEP"; exit "${FAKE_PYTEST_RC:-0}" ;;
esac
exit 0
"""


def _session(tmp_path, script=SESSION, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("python3", FAKE_PYTHON), ("nvidia-smi", "#!/bin/bash\necho 'NVIDIA H200, 143771 MiB'\n")):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text("")  # the carried wheels are 'installed'
    (tmp_path / "models" / "dense").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "calls.log"
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(tmp_path / "out"),
               "FAKE_LOG": str(log), **env}
    environ.setdefault("SITE", str(site))
    got = subprocess.run(["bash", str(script), "run1", str(site)], cwd=ROOT, env=environ, capture_output=True,
                         text=True, timeout=120)
    return got, log.read_text() if log.exists() else ""


def test_serving_session_exits_with_pytests_status(tmp_path):
    """It exited 0 after `pytest rc=124`: a cut-short or failed suite must not look green."""
    got, _ = _session(tmp_path, FAKE_PYTEST_RC="1")
    assert got.returncode == 1, got.stdout + got.stderr
    got, _ = _session(tmp_path, FAKE_PYTEST_SLEEP="30", LIMIT_S="50")  # pytest runs into the time limit
    assert got.returncode == 124 and "split the selection with PYTEST_K" in got.stdout, got.stdout


def test_serving_session_splits_the_selection_with_pytest_k(tmp_path):
    got, calls = _session(tmp_path, PYTEST_K="not moe")
    assert got.returncode == 0, got.stdout + got.stderr
    pytest_call = next(line for line in calls.splitlines() if "-m pytest" in line)
    assert "-k not moe" in pytest_call and "--perf-save" in pytest_call


POWER = ROOT / "dev" / "gpu" / "gpu_serving_power.sh"


def test_serving_power_refuses_a_bad_slowdown_before_any_setup(tmp_path):
    got, calls = _session(tmp_path, POWER, SLOWDOWN="5")
    assert got.returncode == 2 and "SLOWDOWN=5: a fraction of the decode step" in got.stderr
    assert calls == ""  # nothing installed, nothing started


def test_serving_power_runs_a_on_the_plain_server_and_b_on_the_planted_one(tmp_path):
    """Each server is asked of `perfgate serve start` (which returns one already up when asked the
    same, and refuses another knob), the planted one with the knob; power's B side attaches to the
    planted server at the factor the slowdown names."""
    srv = tmp_path / "srv"
    srv.mkdir()
    (srv / "plain.url").write_text("http://127.0.0.1:8101\n")
    (srv / "planted.url").write_text("http://127.0.0.1:8102\n")
    got, calls = _session(tmp_path, POWER, SRV=str(srv), SLOWDOWN="0.1", LIMIT_S="400")
    assert got.returncode == 0, got.stdout + got.stderr
    starts = [line for line in calls.splitlines() if "-m perfgate serve start" in line]
    assert [line.split(" start ", 1)[1] for line in starts] == [
        f"--dir {srv} --name plain --profile gpu",
        f"--dir {srv} --name planted --profile gpu PERFGATE_TEST_MUTATION=serving_decode_slowdown:0.1"]
    power = next(line for line in calls.splitlines() if "-m perfgate power" in line)
    assert "--slowdowns 1.1 " in power and "--env PERFGATE_SERVING_URL=http://127.0.0.1:8101" in power
    assert "--b-env-at 1.1:PERFGATE_SERVING_URL=http://127.0.0.1:8102" in power
    assert "-k single_stream_decode and gpu-dense" in power and "--time-limit" in power
    assert "-p no:hypothesispytest" in power  # ~1 s of each of an A/B's 8 pytest runs
