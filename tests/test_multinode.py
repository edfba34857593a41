"""Multi-node launch path on one machine: two torchrun agents as two "nodes" on loopback.

Each agent runs ``--nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT``; the
ranks join one gloo group across the two agents and run a worker with perfgate.launch.jobs's
contract, ``fn(spec, ctx)``. Real processes, real rendezvous, real collectives.
"""
from __future__ import annotations

import time

import psutil
import pytest

from perfgate.launch import multinode
from perfgate.launch.jobs import WorkerFailure, WorkerTimeout
from perfgate.machine.markers import missing_requirements


def test_two_local_nodes_join_one_group_and_all_reduce():
    res = multinode.launch_multinode("perfgate.launch.multinode:probe", multinode.ProbeSpec(elems=64), nnodes=2,
                                     nproc_per_node=1, launcher="local", timeout_s=120)
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["world_size"] == 2 and r["sum"] == 3.0 and r["wrong"] == 0 for r in res)
    assert sorted(r["node_rank"] for r in res) == [0, 1]  # one rank per node, nodes told apart
    assert len({r["pid"] for r in res}) == 2
    # every rank saw every other rank's (rank, local_rank, node_rank)
    assert res[0]["ranks"] == res[1]["ranks"] == [[r["rank"], r["local_rank"], r["node_rank"]] for r in res]


def test_a_failure_on_the_second_node_reaches_the_caller():
    """Rank 1 (on the other "node") raises inside the probe; its traceback comes back, named."""
    with pytest.raises(WorkerFailure) as info:
        multinode.launch_multinode("perfgate.launch.multinode:probe", multinode.ProbeSpec(), nnodes=2, nproc_per_node=1,
                                   launcher="local", timeout_s=120,
                                   env={"PERFGATE_TEST_FAULT": "raise@1:probe all_reduce"})
    text = str(info.value)
    assert info.value.rank == 1 and "rank 1 of 2 failed (first of" in text
    assert "injected fault" in text and "Traceback" in text


def test_timeout_kills_the_node_launchers():
    t0 = time.monotonic()
    with pytest.raises(WorkerTimeout) as info:
        multinode.launch_multinode("perfgate.launch.multinode:probe", multinode.ProbeSpec(), nnodes=2, nproc_per_node=1,
                                   launcher="local", timeout_s=1.0)
    assert time.monotonic() - t0 < 30
    assert set(info.value.phases) == {0, 1}
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"])
            if any("perfgate-mn-" in a for a in (p.info["cmdline"] or []))]
    assert left == [], f"processes of the killed job still alive: {[p.pid for p in left]}"


def test_torchrun_and_srun_commands():
    argv = multinode.torchrun_argv(nnodes=2, nproc_per_node=8, endpoint="head:29500", run_id="r1",
                                   jobdir="/shared/job", python="python")
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29500",
            "--rdzv-id=r1", "--max-restarts=0"} <= set(argv)
    assert argv[-4:] == ["-m", "perfgate.launch.multinode", "worker", "/shared/job"]
    local = multinode.torchrun_argv(nnodes=2, nproc_per_node=1, endpoint="127.0.0.1:1", run_id="r", jobdir="j",
                                    is_host=False, local_addr="127.0.0.1")
    assert "--rdzv-conf=is_host=0" in local and "--local-addr=127.0.0.1" in local
    srun = multinode.srun_argv(4, argv)
    assert srun[:4] == ["srun", "--nodes=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert srun[-len(argv):] == argv


def test_slurm_variables_become_torch_variables():
    env = multinode.env_from_slurm({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                                     "SLURM_NODEID": "1", "SLURM_NTASKS_PER_NODE": "8(x2)"})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["GROUP_RANK"], env["LOCAL_WORLD_SIZE"]) == \
        ("9", "16", "1", "1", "8")
    assert multinode.env_from_slurm({"RANK": "0", "SLURM_PROCID": "3"})["RANK"] == "0"  # torchrun's wins


def test_launcher_choice_and_validation(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("PERFGATE_MULTINODE_LAUNCHER", raising=False)
    with pytest.raises(ValueError, match="no multi-node launcher"):
        multinode.launch_multinode("m:f", None, nnodes=2, nproc_per_node=1)
    monkeypatch.setenv("SLURM_JOB_ID", "123")
    monkeypatch.delenv("PERFGATE_SHARED_DIR", raising=False)
    with pytest.raises(ValueError, match="PERFGATE_SHARED_DIR"):
        multinode.launch_multinode("m:f", None, nnodes=2, nproc_per_node=1)
    with pytest.raises(ValueError, match="package.module:function"):
        multinode.launch_multinode("nocolon", None, nnodes=2, nproc_per_node=1, launcher="local")


def test_multinode_marker_needs_nnodes(monkeypatch):
    monkeypatch.delenv("PERFGATE_NNODES", raising=False)
    assert any("docs/multinode.md" in m for m in missing_requirements({"multinode"}))
    monkeypatch.setenv("PERFGATE_NNODES", "2")
    assert missing_requirements({"multinode"}) == []
    monkeypatch.setenv("PERFGATE_NPROC_PER_NODE", "4")
    assert multinode.nodes_from_env() == (2, 4)
