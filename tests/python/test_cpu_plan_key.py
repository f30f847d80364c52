"""CPU tests of the key the ops' plans are cached under (python/csrc/plan_key.hpp),
through weft._C._PlanKey: calls whose plans are built for the same integers
share a key, a difference in any one field or in the operator separates them
(in the hash too), and a key's text is the plan's name in errors."""

import struct

import pytest

import weft

PlanKey = weft._C._PlanKey

BF16, FP16, FP32 = 0, 1, 2  # weft::DType
AUTOMATIC, FUSED, SEQUENTIAL = 0, 1, 2  # weft::OverlapMode
CONTIGUOUS, PAGED = 0, 1  # weft::KvLayout
SCALE_BITS = struct.unpack("<I", struct.pack("<f", 0.125))[0]

# One key of each kind, and its text: the plan's name as errors and logs print it.
KEYS = {
    "all_reduce": ([512, BF16], "all_reduce 512 x bf16"),
    "all_gather": ([1024], "all_gather 1024 bytes per rank"),
    "reduce_scatter": ([128, FP32], "reduce_scatter 128 x fp32 per rank"),
    "ag_gemm": ([4096, 8192, 1024], "ag_gemm m=4096 n=8192 k=1024"),
    "gemm_rs": ([4096, 8192, 1024], "gemm_rs m=4096 n=8192 k=1024"),
    "gemm_ar": ([4096, 8192, 1024], "gemm_ar m=4096 n=8192 k=1024"),
    "expert_parallel": ([64, 4096, 8, 128, 0],
                        "expert_parallel experts=64 hidden=4096 top_k=8 max_tokens=128 max_sms=0"),
    "expert_parallel_low_latency": ([64, 4096, 8, 128, 24], "expert_parallel_low_latency experts=64 hidden=4096 "
                                    "top_k=8 max_tokens=128 max_sms=24"),
    "flash_decode": ([PAGED, 4, 32, 8, 128, FP16, 0, 64, 16, SCALE_BITS],
                     f"flash_decode paged b=4 heads=32/8 d=128 fp16 kv=0 pages=64x16 scale_bits={SCALE_BITS}"),
    "dist_flash_decode": ([CONTIGUOUS, 2, 32, 8, 64, BF16, 4096, 0, 0, 0],
                          "dist_flash_decode contiguous b=2 heads=32/8 d=64 bf16 kv=4096 pages=0x0 scale_bits=0"),
    "ag_moe": ([128, 2048, 8, 512, BF16, 0, SEQUENTIAL],
               "ag_moe experts=128 hidden=2048 top_k=8 cap=512 bf16 max_sms=0 mode=sequential"),
    "moe_rs": ([128, 2048, 8, 512, FP16, 3, FUSED],
               "moe_rs experts=128 hidden=2048 top_k=8 cap=512 fp16 max_sms=3 mode=fused"),
}


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_text_is_the_plans_name(kind):
    fields, text = KEYS[kind]
    assert str(PlanKey(kind, fields)) == text


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_same_fields_share_a_key(kind):
    fields, _ = KEYS[kind]
    a, b = PlanKey(kind, fields), PlanKey(kind, list(fields))
    assert a == b and not a != b
    assert a.hash == b.hash and hash(a) == hash(b)
    assert len({a: 1, b: 2}) == 1


@pytest.mark.parametrize("kind", sorted(KEYS))
def test_any_one_field_separates(kind):
    fields, _ = KEYS[kind]
    base = PlanKey(kind, fields)
    for i in range(len(fields)):
        for delta in (1, -1, 1 << 40):
            other = list(fields)
            other[i] += delta
            key = PlanKey(kind, other)
            assert key != base, (i, delta)
            assert key.hash != base.hash, (i, delta)


def test_kinds_with_the_same_fields_separate():
    groups = [["all_reduce", "reduce_scatter"], ["ag_gemm", "gemm_rs", "gemm_ar"],
              ["expert_parallel", "expert_parallel_low_latency"], ["flash_decode", "dist_flash_decode"],
              ["ag_moe", "moe_rs"]]
    for group in groups:
        fields = KEYS[group[0]][0]
        keys = [PlanKey(kind, fields) for kind in group]
        assert len(set(keys)) == len(group), group
        assert len({k.hash for k in keys}) == len(group), group
    # Fields the kinds leave unused are zero: a key of one field is still not another kind's.
    assert PlanKey("all_gather", [512]) != PlanKey("all_reduce", [512, 0])


def test_bad_kind_or_field_count_is_refused():
    with pytest.raises(ValueError, match='no plan kind "all_to_all"'):
        PlanKey("all_to_all", [1])
    with pytest.raises(ValueError, match="a gemm_rs key has 3 fields, got 2"):
        PlanKey("gemm_rs", [1, 2])
