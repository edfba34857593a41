"""Developer probe (not product): what one GPU offers for sizing and energy, and whether a
finished FSDP1 case's memory comes back once its parameter storages are freed."""
import gc, json, os, sys, time

import torch

out = {}
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(0)
def q(name, f, *a):
    try:
        v = f(h, *a); out[name] = v.decode() if isinstance(v, bytes) else v
    except Exception as e:  # noqa
        out[name] = f"ERR {type(e).__name__}: {e}"
q("name", nv.nvmlDeviceGetName)
q("power_limit_mw", nv.nvmlDeviceGetEnforcedPowerLimit)
q("power_default_mw", nv.nvmlDeviceGetPowerManagementDefaultLimit)
q("sm_clock_max", nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_SM)
q("mem_clock_max", nv.nvmlDeviceGetMaxClockInfo, nv.NVML_CLOCK_MEM)
q("sm_app_clock", nv.nvmlDeviceGetApplicationsClock, nv.NVML_CLOCK_SM)
q("mem_app_clock", nv.nvmlDeviceGetApplicationsClock, nv.NVML_CLOCK_MEM)
q("energy_mj_0", nv.nvmlDeviceGetTotalEnergyConsumption)
q("power_mw_idle", nv.nvmlDeviceGetPowerUsage)
q("persistence", nv.nvmlDeviceGetPersistenceMode)
q("vbios", nv.nvmlDeviceGetVbiosVersion)
q("serial", nv.nvmlDeviceGetSerial)
q("uuid", nv.nvmlDeviceGetUUID)
free, total = torch.cuda.mem_get_info()
out["mem_get_info_gib"] = [free / 2**30, total / 2**30]
# energy counter resolution: distinct values seen over 1 s of polling under load
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5): a @ a
torch.cuda.synchronize()
seen = []; t0 = time.perf_counter(); e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
while time.perf_counter() - t0 < 2.0:
    for _ in range(4): a @ a
    seen.append((time.perf_counter() - t0, nv.nvmlDeviceGetTotalEnergyConsumption(h)))
torch.cuda.synchronize()
e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h); t1 = time.perf_counter() - t0
vals = [v for _, v in seen]
changes = [(round(t, 4), v) for (t, v), (_, pv) in zip(seen[1:], seen[:-1]) if v != pv]
out["energy_burn"] = {"J": (e1 - e0) / 1000, "s": t1, "W": (e1 - e0) / 1000 / t1,
                      "polls": len(vals), "changes": len(changes), "first_changes": changes[:12]}
q("power_mw_load", nv.nvmlDeviceGetPowerUsage)
q("sm_clock_now", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
del a; torch.cuda.empty_cache()

# FSDP1 leak: does a finished case's memory stay, and does freeing storages release it?
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29533")
import torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from perfgate.workloads.training.model import GPTBlock, build_model, get_config, SyntheticTokens, loss_fn
cfg = get_config("gpt-368m")
def case(free_storage):
    m = build_model(cfg, torch.device("cuda"), seed=0)
    w = FSDP(m, sharding_strategy=ShardingStrategy.FULL_SHARD, auto_wrap_policy=ModuleWrapPolicy({GPTBlock}),
             device_id=torch.device("cuda"), use_orig_params=False, limit_all_gathers=True)
    opt = torch.optim.AdamW(w.parameters(), lr=1e-4, fused=True)
    data = SyntheticTokens(cfg, 1, torch.device("cuda"), 0, 0, 1)
    for i in range(2):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(w, data.batch(i, 0))
        loss.backward(); opt.step()
    torch.cuda.synchronize()
    if free_storage:
        for st in opt.state.values():
            for t in st.values():
                if torch.is_tensor(t): t.untyped_storage().resize_(0)
        for p in w.parameters():
            p.grad = None
            p.untyped_storage().resize_(0)
        for b in w.buffers():
            b.untyped_storage().resize_(0)
    del w, opt, m, data, loss
    gc.collect(); torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() / 2**30
out["fsdp1_leak_gib"] = [case(False), case(False), case(True), case(True)]
dist.destroy_process_group()
print(json.dumps(out, indent=1, default=str))
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "probe.json"), "w"), indent=1, default=str)
