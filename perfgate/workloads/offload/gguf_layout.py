"""Per-expert byte segments of a MoE GGUF file.

An offloading runtime reads a missed expert as three preads, one into each of
`blk.N.ffn_gate_exps.weight`, `blk.N.ffn_up_exps.weight` and `blk.N.ffn_down_exps.weight`.
Each of those tensors stores all experts of layer N back to back (the expert index is the slowest
GGML dimension, ne[2]), so expert e's segment is `data_offset + e * bytes_per_expert` for
`bytes_per_expert = n_bytes / n_experts`. The three tensors are separate in the file (the seed's
Qwen3 35B-A3B: down at 995 MB, gate at 1181 MB, up at 1335 MB for layer 0), which is why one
expert costs three independent reads.

Offsets come from gguf's own GGUFReader (header and tensor infos only; tensor data is memory-mapped
but never touched here), so the layout is exactly what llama.cpp would use.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KINDS: tuple[str, ...] = ("gate", "up", "down")
"""Segment order used everywhere in this package (and by the sentinel fixture)."""

_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")


class GGUFLayoutError(ValueError):
    """The file cannot give an expert layout; the message names the file and what to do."""


@dataclass(frozen=True)
class Segment:
    """One contiguous byte range of the file (absolute offset)."""

    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


@dataclass(frozen=True)
class ExpertSegments:
    """The three reads that bring one expert of one layer into memory."""

    layer: int
    expert: int
    gate: Segment
    up: Segment
    down: Segment

    @property
    def segments(self) -> tuple[Segment, Segment, Segment]:
        """In KINDS order: gate, up, down."""
        return (self.gate, self.up, self.down)

    @property
    def nbytes(self) -> int:
        return self.gate.length + self.up.length + self.down.length


@dataclass(frozen=True)
class LayerTensors:
    """Where one layer's three expert tensors start, and how many bytes one expert takes in each."""

    layer: int
    n_experts: int
    data_offset: dict[str, int]
    bytes_per_expert: dict[str, int]
    tensor_type: dict[str, str]


@dataclass(frozen=True)
class ExpertLayout:
    """All MoE layers of one GGUF file. Dense layers (no *_exps tensors) are simply absent."""

    path: Path
    file_bytes: int
    layers: tuple[LayerTensors, ...]
    expert_used_count: int | None

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(lt.layer for lt in self.layers)

    @property
    def n_experts(self) -> int:
        return self.layers[0].n_experts

    def layer(self, layer: int) -> LayerTensors:
        for lt in self.layers:
            if lt.layer == layer:
                return lt
        raise KeyError(f"{self.path}: layer {layer} has no expert tensors (MoE layers: {self.layer_ids})")

    def expert(self, layer: int, expert: int) -> ExpertSegments:
        lt = self.layer(layer)
        if not 0 <= expert < lt.n_experts:
            raise IndexError(f"{self.path}: layer {layer} has experts 0..{lt.n_experts - 1}, not {expert}")
        seg = {
            kind: Segment(lt.data_offset[kind] + expert * lt.bytes_per_expert[kind], lt.bytes_per_expert[kind])
            for kind in KINDS
        }
        return ExpertSegments(layer, expert, seg["gate"], seg["up"], seg["down"])

    def experts(self):
        """Every (layer, expert) in file order of layers."""
        for lt in self.layers:
            for e in range(lt.n_experts):
                yield self.expert(lt.layer, e)

    @property
    def segment_bytes(self) -> tuple[int, int, int]:
        """Bytes per expert of gate, up, down in the first MoE layer (the seed: 589,824 / 589,824 / 720,896)."""
        lt = self.layers[0]
        return tuple(lt.bytes_per_expert[k] for k in KINDS)  # type: ignore[return-value]

    @property
    def expert_bytes(self) -> int:
        return sum(self.segment_bytes)

    @property
    def expert_region_bytes(self) -> int:
        """Bytes of the file held by expert tensors (what an offloading runtime streams)."""
        return sum(lt.n_experts * sum(lt.bytes_per_expert.values()) for lt in self.layers)


def read_expert_layout(path: str | Path) -> ExpertLayout:
    """Read the expert layout of a GGUF file, or raise GGUFLayoutError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise GGUFLayoutError(f"{path}: no such file (pass the path of a .gguf model file)")
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - dependency message
        raise GGUFLayoutError("reading GGUF needs the `gguf` package: pip install 'perfgate[offload]'") from exc
    try:
        reader = GGUFReader(path, "r")
    except Exception as exc:  # the reader raises ValueError/struct errors/IndexError on non-GGUF data
        raise GGUFLayoutError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc

    found: dict[int, dict[str, object]] = {}
    for t in reader.tensors:
        m = _EXPERT_TENSOR.match(t.name)
        if m:
            found.setdefault(int(m.group(1)), {})[m.group(2)] = t
    if not found:
        names = [t.name for t in reader.tensors[:5]]
        raise GGUFLayoutError(
            f"{path}: GGUF file has no MoE expert tensors (blk.N.ffn_{{gate,up,down}}_exps.weight); "
            f"{len(reader.tensors)} tensors, first: {names}. Is this a dense model?"
        )

    layers = []
    for layer in sorted(found):
        tensors = found[layer]
        missing = [k for k in KINDS if k not in tensors]
        if missing:
            raise GGUFLayoutError(
                f"{path}: layer {layer} has expert tensors {sorted(tensors)} but lacks {missing} "
                "(merged gate_up tensors are not supported)"
            )
        n_experts = {k: int(tensors[k].shape[-1]) for k in KINDS}  # GGUF ne order: ne[2] = experts
        if len(set(n_experts.values())) != 1:
            raise GGUFLayoutError(f"{path}: layer {layer} expert counts disagree across gate/up/down: {n_experts}")
        n = n_experts["gate"]
        per = {}
        for k in KINDS:
            nbytes = int(tensors[k].n_bytes)
            if nbytes % n:
                raise GGUFLayoutError(f"{path}: {tensors[k].name} has {nbytes} bytes, not divisible by {n} experts")
            per[k] = nbytes // n
        layers.append(
            LayerTensors(
                layer=layer,
                n_experts=n,
                data_offset={k: int(tensors[k].data_offset) for k in KINDS},
                bytes_per_expert=per,
                tensor_type={k: tensors[k].tensor_type.name for k in KINDS},
            )
        )
    return ExpertLayout(
        path=path,
        file_bytes=path.stat().st_size,
        layers=tuple(layers),
        expert_used_count=_expert_used_count(reader),
    )


def _expert_used_count(reader) -> int | None:
    """`<arch>.expert_used_count` (k, experts per token) when the file states it."""
    for name, field in reader.fields.items():
        if name.endswith(".expert_used_count") and field.types:
            try:
                return int(field.parts[field.data[0]][0])
            except (IndexError, TypeError, ValueError):
                return None
    return None
