"""Precise mode: vLLM KV-event batches decoded and folded into the prefix index."""

from __future__ import annotations

import msgpack
import pytest

from zoe_cluster.routing import ReplicaView, context_from_trace, get_policy
from zoe_cluster.routing.kv_events import (
    KvEventDecodeError,
    ReplicaCacheMirror,
    decode_batch,
    summarize,
    summarize_batch,
)


def batch(*events):
    return msgpack.packb([1.0, list(events), 0])


def stored(n, size=16):
    return {"type": "BlockStored", "block_hashes": list(range(n)), "parent_block_hash": None,
            "token_ids": [1] * (n * size), "block_size": size, "lora_id": None, "medium": "GPU"}


def test_decode_and_summarize_vllm_batches():
    s = summarize(decode_batch(batch(stored(4), {"type": "BlockRemoved", "block_hashes": [1, 2], "medium": None})))
    assert (s.stored_blocks, s.removed_blocks, s.cleared, s.block_size) == (4, 2, False, 16)
    assert summarize(decode_batch(batch(stored(3), {"type": "AllBlocksCleared"}))).cleared
    arr = summarize(decode_batch(msgpack.packb([1.0, [["BlockRemoved", [5, 6, 7], None]], 0])))
    assert arr.removed_blocks == 3
    for bad in (b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1.0, [42], 0])):
        with pytest.raises(KvEventDecodeError):
            decode_batch(bad)


def test_mirror_counts_and_detects_gaps():
    m = ReplicaCacheMirror()
    assert m.apply(summarize(decode_batch(batch(stored(10, 32)))), seq=0) == 0
    assert m.apply(summarize(decode_batch(batch({"type": "BlockRemoved", "block_hashes": [1, 2, 3]}))), seq=3) == 96
    assert m.blocks == 7 and m.gaps == 2 and m.block_size == 32
    assert m.apply(summarize(decode_batch(batch({"type": "AllBlocksCleared"})))) is None and m.blocks == 0


def test_prefix_index_forgets_what_the_engine_evicted():
    p = get_policy("prefix")
    reps = [ReplicaView("d/0/0", "http://a")]
    ctx = context_from_trace("a", "m", list(range(8)), 8 * 512, 1)
    d = p.select(ctx, reps)
    p.on_routed(ctx, d)
    idx = p.index_of("d/0/0")
    assert len(idx) == 8
    p.on_cache_evicted("d/0/0", 300)  # less than one block: carried, nothing forgotten yet
    assert len(idx) == 8
    p.on_cache_evicted("d/0/0", 300 + 1024)  # 1624 tokens in all -> 3 blocks of 512
    assert len(idx) == 5 and idx.match(ctx.block_hashes) == 5  # the tail went first
    p.on_cache_evicted("d/0/0", None)
    assert len(idx) == 0


def test_mirror_keys_streams_by_data_parallel_rank_and_tier():
    def ranked(rank, *events):
        return summarize_batch(msgpack.packb([1.0, list(events), rank]))

    m = ReplicaCacheMirror()
    # two ranks publish their own sequences, interleaved: no batch is lost
    assert m.apply(ranked(0, stored(10)), seq=0) == 0
    assert m.apply(ranked(1, stored(6)), seq=0) == 0
    assert m.apply(ranked(0, {"type": "BlockRemoved", "block_hashes": [1, 2]}), seq=1) == 32
    assert m.apply(ranked(1, stored(1)), seq=1) == 0
    assert m.gaps == 0 and m.blocks == 8 + 7 and m.ranks[1].blocks == 7
    # one rank clears: only its blocks are forgotten, in tokens
    assert m.apply(ranked(1, {"type": "AllBlocksCleared"}), seq=2) == 7 * 16
    assert m.blocks == 8
    assert m.apply(ranked(0, stored(1)), seq=5) == 0 and m.gaps == 3
    # host-tier (offloaded) blocks do not count against the HBM picture
    s = ranked(0, {"type": "BlockRemoved", "block_hashes": [1, 2, 3], "medium": "CPU"}, stored(2))
    assert (s.removed_blocks, s.stored_blocks, s.dp_rank) == (0, 2, 0)
    assert summarize_batch(msgpack.packb([1.0, [stored(1)]])).dp_rank is None
