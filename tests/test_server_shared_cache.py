"""Servers of one session share vLLM's model-class inspection cache, and nothing else of VLLM_CACHE_ROOT.

Each `vllm serve` inspects the model class in a fresh interpreter unless VLLM_CACHE_ROOT/modelinfos holds
the result (vllm/model_executor/models/registry.py): ~20 s of every start on the H200 host, since each
server had a cache root of its own. The fake server below does what vLLM does with that folder (reads the
file, or "inspects" and writes it) and says which in its log; it runs through the real ServerPool and
start_server path (PERFGATE_VLLM_CMD), as tests/test_faults_server.py does."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from fixtures.serving import ServerPool
from perfgate.workloads.serving import server as server_mod
from test_faults_server import FAKE_VLLM, model

CACHE_PREAMBLE = r'''
import json, os, pathlib
_info = pathlib.Path(os.environ["VLLM_CACHE_ROOT"]) / "modelinfos" / "LlamaForCausalLM.json"
if _info.exists():
    print("INFO model info from cache", json.loads(_info.read_text())["hash"], flush=True)
else:
    _info.parent.mkdir(parents=True, exist_ok=True)
    _info.write_text(json.dumps({"hash": "abc", "modelinfo": {}}))
    print("INFO model info inspected in a subprocess", flush=True)
_compiled = pathlib.Path(os.environ["VLLM_CACHE_ROOT"]) / "torch_compile_cache"
print("INFO compile cache", "warm" if _compiled.exists() else "cold", flush=True)
_compiled.mkdir(parents=True, exist_ok=True)
'''


@pytest.fixture
def caching_vllm(tmp_path, monkeypatch):
    script = tmp_path / "fake_vllm_cache.py"
    script.write_text(CACHE_PREAMBLE + FAKE_VLLM)
    monkeypatch.setenv("PERFGATE_VLLM_CMD", f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}")


def start(pool: ServerPool, tmp_path: Path, key: str) -> str:
    server = pool.get(key, model(tmp_path), (), timeout_s=30)
    text = server.log_path.read_text()
    pool.release(key)
    return text


def test_the_second_server_of_a_session_reads_the_first_ones_model_info(tmp_path, caching_vllm):
    pool = ServerPool(tmp_path / "servers", lambda _: None)
    try:
        first, second = start(pool, tmp_path, "a"), start(pool, tmp_path, "b")
    finally:
        pool.stop_all()
    assert "model info inspected in a subprocess" in first
    assert "model info from cache abc" in second
    # the compile cache stays each server's own: a start-up time still includes its compile
    assert "compile cache cold" in first and "compile cache cold" in second


def test_another_session_starts_cold(tmp_path, caching_vllm):
    for root in ("session1", "session2"):
        pool = ServerPool(tmp_path / root, lambda _: None)
        try:
            assert "model info inspected in a subprocess" in start(pool, tmp_path, "a")
        finally:
            pool.stop_all()


def test_contained_env_links_only_the_shareable_caches(tmp_path):
    shared = tmp_path / "shared"
    for name in ("01-a", "02-b"):
        env = server_mod.contained_env(tmp_path / name, shared_cache=shared)
        cache = Path(env["VLLM_CACHE_ROOT"])
        assert cache == tmp_path / name / "cache"
        assert sorted(p.name for p in cache.iterdir()) == sorted(server_mod.SHAREABLE_CACHES)
        assert (cache / "modelinfos").resolve() == (shared / "modelinfos").resolve()
    server_mod.contained_env(tmp_path / "01-a", shared_cache=shared)  # again: the link is kept, not re-made
    assert (tmp_path / "01-a" / "cache" / "modelinfos").is_symlink()


def test_without_a_shared_cache_nothing_is_linked(tmp_path):
    cache = Path(server_mod.contained_env(tmp_path / "w")["VLLM_CACHE_ROOT"])
    assert cache.is_dir() and not any(p.is_symlink() for p in cache.iterdir())
