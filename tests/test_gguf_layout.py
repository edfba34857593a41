"""The expert layout reader against files written by gguf's own GGUFWriter.

Every byte of every expert segment is compared with the sentinel the fixture wrote there, so an
off-by-one expert, a swapped gate/up, or an offset relative to the wrong base cannot pass.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from fixtures.gguf_experts import ExpertFileSpec, expected_segment, write_expert_gguf
from perfgate.workloads.offload.expert_reads import ExpertReader, ReadSpec, read_expert_bytes
from perfgate.workloads.offload.gguf_layout import KINDS, GGUFLayoutError, read_expert_layout

pytestmark = pytest.mark.cpu


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "small.gguf"
    write_expert_gguf(path, ExpertFileSpec(n_layers=2, n_experts=4))
    return path


def test_layout_matches_seed_shapes(small_gguf):
    layout = read_expert_layout(small_gguf)
    assert layout.layer_ids == (0, 1)
    assert layout.n_experts == 4
    assert layout.segment_bytes == (589_824, 589_824, 720_896)
    assert layout.expert_used_count == 8
    assert layout.layers[0].tensor_type == {"gate": "Q4_K", "up": "Q4_K", "down": "Q5_K"}
    # the seed's file order within a layer: down, then gate, then up
    seg = layout.expert(0, 0)
    assert seg.down.offset < seg.gate.offset < seg.up.offset


def test_every_segment_byte_matches_its_sentinel(small_gguf):
    layout = read_expert_layout(small_gguf)
    seen = 0
    for ex in layout.experts():
        for kind, data in zip(KINDS, read_expert_bytes(small_gguf, ex)):
            want = expected_segment(ex.layer, kind, ex.expert, len(data))
            if data != want:
                first = int(np.argmax(np.frombuffer(data, np.uint8) != np.frombuffer(want, np.uint8)))
                pytest.fail(f"layer {ex.layer} expert {ex.expert} {kind}: first wrong byte at +{first}")
            seen += 1
    assert seen == 2 * 4 * 3


def test_segments_do_not_overlap_and_stay_in_the_file(small_gguf):
    layout = read_expert_layout(small_gguf)
    spans = sorted((s.offset, s.end) for ex in layout.experts() for s in ex.segments)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert spans[-1][1] <= os.path.getsize(small_gguf)


@pytest.mark.parametrize("direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.parametrize("spec", [ReadSpec("sequential", k=3, threads=3), ReadSpec("parallel", k=3, threads=9),
                                  ReadSpec("parallel", k=3, threads=9, split=3)], ids=lambda s: s.label)
def test_timed_reads_deliver_the_right_bytes(small_gguf, spec, direct):
    layout = read_expert_layout(small_gguf)
    # experts 2 and 3 are adjacent in every tensor: their O_DIRECT spans share a 4 KiB block
    experts = [layout.expert(1, 3), layout.expert(0, 2), layout.expert(1, 2)]
    with ExpertReader(layout, direct=direct) as reader:
        assert reader.sample(spec, experts) > 0
        delivered = reader.delivered(experts, spec)
    for ex, segs in zip(experts, delivered):
        for kind, seg, data in zip(KINDS, ex.segments, segs):
            assert data == expected_segment(ex.layer, kind, ex.expert, seg.length), \
                f"{spec.label} {kind} of layer {ex.layer} expert {ex.expert}"


def test_not_a_gguf_names_the_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"this is not a model\n" * 100)
    with pytest.raises(GGUFLayoutError, match=r"model\.gguf: not a readable GGUF"):
        read_expert_layout(bad)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(GGUFLayoutError, match=r"nothing\.gguf: no such file"):
        read_expert_layout(tmp_path / "nothing.gguf")


def test_dense_gguf_says_it_has_no_experts(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "dense.gguf"
    w = GGUFWriter(path, "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFLayoutError, match=r"dense\.gguf: GGUF file has no MoE expert tensors"):
        read_expert_layout(path)
