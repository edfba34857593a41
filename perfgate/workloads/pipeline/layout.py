"""One validated description of a parallel layout: TP x PP x DP, microbatches, schedule.

Why a class of its own: every constraint that an engine would only report after processes
have started (Megatron's ``microbatch_group_size_per_vp_stage`` check, torch's
``Schedule1F1B`` refusing M < PP, a layer count that does not split into virtual stages)
is checked here, in the parent, at construction. A wrong test parameter then fails in
milliseconds with a message that names the numbers, never as a traceback from rank 3
after a minute of start-up. Modelled on torchtitan's ``ParallelDims``. Which ranks form each group
(the order of the dimensions, rank -> coordinate) is perfgate.workloads.mesh.layout's ``MeshLayout``,
whose degree check this one shares.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate import mutations
from perfgate.workloads.mesh.layout import check_degrees

# Schedules each engine can run, by the names used in test ids.
SCHEDULES: dict[str, tuple[str, ...]] = {
    "torch": ("gpipe", "1f1b", "interleaved-1f1b"),
    "megatron": ("1f1b", "interleaved-1f1b"),
}


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees and pipeline settings of one run; invalid combinations raise ValueError.

    ``microbatches`` is M, the number of microbatches one optimizer step goes through
    (per data-parallel replica). ``virtual_stages`` is v, model chunks per pipeline rank
    (v > 1 only for the interleaved schedule). ``num_layers`` (optional) is checked to
    split evenly over ``pp * virtual_stages`` chunks, as both engines' uniform splits need.
    """

    world_size: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    microbatches: int = 1
    virtual_stages: int = 1
    schedule: str = "1f1b"
    engine: str = "torch"
    num_layers: int | None = None
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        for name in ("world_size", "tp", "pp", "dp", "microbatches", "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_degrees(self.world_size, {"tp": self.tp, "pp": self.pp, "dp": self.dp})  # the mesh's own rule
        if self.engine not in SCHEDULES:
            raise ValueError(f"unknown engine {self.engine!r}; known: {', '.join(SCHEDULES)}")
        if self.schedule not in SCHEDULES[self.engine]:
            raise ValueError(f"engine {self.engine} has no schedule {self.schedule!r}; "
                             f"known: {', '.join(SCHEDULES[self.engine])}")
        if self.sequence_parallel and self.tp < 2:
            raise ValueError(f"sequence parallelism splits activations over the TP group: needs tp >= 2, "
                             f"got tp {self.tp}")
        if self.engine == "torch" and (self.tp != 1 or self.dp != 1):
            raise ValueError(f"the torch.distributed.pipelining workload runs pure pipeline parallelism: "
                             f"needs tp 1 and dp 1, got tp {self.tp}, dp {self.dp}")
        self._check_schedule()
        if self.num_layers is not None:
            chunks = self.pp * self.virtual_stages
            if self.num_layers < chunks or self.num_layers % chunks:
                raise ValueError(
                    f"num_layers {self.num_layers} does not split evenly over pp {self.pp} x "
                    f"virtual_stages {self.virtual_stages} = {chunks} model chunks")

    def _check_schedule(self) -> None:
        pp, m, v = self.pp, self.microbatches, self.virtual_stages
        interleaved = self.schedule == "interleaved-1f1b"
        if interleaved:
            if pp < 2:
                raise ValueError(f"interleaved-1f1b needs pp >= 2 (it interleaves chunks across stages), got pp {pp}")
            if v < 2:
                raise ValueError(f"interleaved-1f1b needs virtual_stages >= 2 model chunks per rank, got {v}")
        elif v != 1:
            raise ValueError(f"virtual_stages {v} > 1 needs the interleaved-1f1b schedule, got {self.schedule}")
        if self.engine == "torch":
            if self.schedule == "1f1b" and m < pp:
                # torch's Schedule1F1B raises this too, but only inside the ranks.
                raise ValueError(f"torch Schedule1F1B needs microbatches >= pp: got M {m} < PP {pp}")
            if interleaved:
                rounds = max(1, m // pp)
                if m % rounds:
                    raise ValueError(f"torch ScheduleInterleaved1F1B needs M to be a multiple of its "
                                     f"rounds max(1, M // PP) = {rounds}: got M {m}, PP {pp}")
        elif self.engine == "megatron" and interleaved:
            # Megatron groups microbatch_group_size_per_vp_stage (= PP) microbatches per chunk; it
            # refuses M < PP and a remainder M % PP in (0, PP).
            if m < pp or m % pp:
                raise ValueError(f"Megatron's interleaved schedule needs microbatches to be a multiple "
                                 f"of pp: got M {m}, PP {pp}")

    @property
    def model_chunks(self) -> int:
        """Pipeline chunks the model is cut into (pp x v)."""
        return self.pp * self.virtual_stages

    def chunk_layers(self, chunk: int) -> range:
        """Transformer layers of model chunk ``chunk`` (0 .. pp*v-1) under a uniform split."""
        if self.num_layers is None:
            raise ValueError("chunk_layers needs num_layers")
        if not 0 <= chunk < self.model_chunks:
            raise ValueError(f"chunk {chunk} out of range 0..{self.model_chunks - 1}")
        per = self.num_layers // self.model_chunks
        if self.model_chunks == 2 and mutations.active("skewed_stage_split"):
            cut = self.num_layers * 3 // 4
            return range(0, cut) if chunk == 0 else range(cut, self.num_layers)
        return range(chunk * per, (chunk + 1) * per)

    def rank_chunks(self, pp_rank: int) -> list[int]:
        """Chunks held by pipeline rank ``pp_rank``: rank r holds r, r+pp, r+2pp... (the loop
        placement both torch's interleaved schedules and Megatron's virtual pipeline use)."""
        if not 0 <= pp_rank < self.pp:
            raise ValueError(f"pp_rank {pp_rank} out of range 0..{self.pp - 1}")
        return [pp_rank + k * self.pp for k in range(self.virtual_stages)]

    def label(self) -> str:
        """Short id fragment, e.g. ``pp4-v2-m16``."""
        parts = []
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        parts.append(f"pp{self.pp}")
        if self.dp > 1:
            parts.append(f"dp{self.dp}")
        if self.virtual_stages > 1:
            parts.append(f"v{self.virtual_stages}")
        parts.append(f"m{self.microbatches}")
        return "-".join(parts)


def pipeline_layouts(spec, engine: str, num_layers: int) -> tuple[ParallelLayout, ...]:
    """Every (PP, M) layout of a pipeline spec (``pp``, ``schedule``, ``virtual_stages``,
    ``microbatches``), validated here in the parent: a bad one never starts a process."""
    return tuple(ParallelLayout(world_size=spec.pp, pp=spec.pp, microbatches=m, virtual_stages=spec.virtual_stages,
                                schedule=spec.schedule, engine=engine, num_layers=num_layers)
                 for m in spec.microbatches)
