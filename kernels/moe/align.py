"""Sort token->expert edges by expert and build the tile work list of the fused MoE (one Triton launch).

Edge j = token * top_k + slot is the j-th entry of `topk_ids.flatten()`. The kernel buckets edges by expert,
pads every expert's bucket to a multiple of BLOCK_M and writes:
- `sorted_ids [max_padded]` int32: edge ids grouped by expert, stable within an expert; padding slots hold
  `num_edges` (a sentinel the GEMM stages mask out);
- `block_expert [max_blocks]` int32: the expert of each BLOCK_M tile, -1 for tiles past the end;
- `num_padded [1]` int32: the number of used slots (a multiple of BLOCK_M).
Experts with no edges get no tile. Edges whose expert id is outside [0, E) (e.g. -1 for experts that live
on another rank) are dropped. Sizes are bounded by the shapes alone, so the launch can be graph-captured.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _moe_align_kernel(
    topk_ids_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    num_edges, num_experts, max_padded, max_blocks,
    BLOCK_M: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr, CHUNK_B: tl.constexpr,
):
    eoffs = tl.arange(0, E_PAD)
    lanes = tl.arange(0, CHUNK)
    dummy = E_PAD - 1  # a bin past every real expert (E_PAD > num_experts)

    # Pass 1: edges per expert.
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, num_edges, CHUNK):
        offs = start + lanes
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_edges, other=-1).to(tl.int32)
        ids = tl.where((ids >= 0) & (ids < num_experts), ids, dummy)
        counts += tl.histogram(ids, E_PAD)
    counts = tl.where(eoffs < num_experts, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, 0)
    pad_start = pad_end - padded
    total = tl.sum(padded, 0)
    tl.store(num_padded_ptr, total)

    # Padding slots hold the sentinel; the scatter below overwrites the used ones.
    for start in range(0, max_padded, CHUNK):
        offs = start + lanes
        tl.store(sorted_ids_ptr + offs, tl.zeros([CHUNK], dtype=tl.int32) + num_edges, mask=offs < max_padded)

    # The expert of each tile: the number of experts whose padded range ends at or before the tile's start.
    for start in range(0, max_blocks, CHUNK_B):
        b = start + tl.arange(0, CHUNK_B)
        row = b * BLOCK_M
        before = (pad_end[None, :] <= row[:, None]) & (eoffs[None, :] < num_experts)
        expert = tl.sum(before.to(tl.int32), axis=1)
        expert = tl.where(row < total, expert, -1)
        tl.store(block_expert_ptr + b, expert, mask=b < max_blocks)
    tl.debug_barrier()

    # Pass 2: scatter edge ids, stable: rank inside a chunk by a sort on (expert, lane).
    running = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, num_edges, CHUNK):
        offs = start + lanes
        ids = tl.load(topk_ids_ptr + offs, mask=offs < num_edges, other=-1).to(tl.int32)
        ids = tl.where((ids >= 0) & (ids < num_experts), ids, dummy)
        hist = tl.histogram(ids, E_PAD)
        first = tl.cumsum(hist, 0) - hist  # first sorted position of each expert in this chunk
        key = tl.sort(ids * CHUNK + lanes)
        sid = key // CHUNK
        edge = start + key % CHUNK
        base = tl.gather(pad_start + running - first, sid, 0)
        dest = base + lanes
        tl.store(sorted_ids_ptr + dest, edge, mask=(sid < num_experts) & (edge < num_edges))
        running += hist


def align_sizes(num_edges: int, num_experts: int, block_m: int) -> tuple[int, int]:
    """(max_padded, max_blocks): upper bounds that hold for every routing of `num_edges` edges."""
    active = min(num_experts, num_edges)
    max_padded = triton.cdiv(num_edges + active * (block_m - 1), block_m) * block_m
    return max_padded, max_padded // block_m


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Bucket the edges of `topk_ids [M, k]` (int) by expert. Returns (sorted_ids, block_expert, num_padded)."""
    if block_m <= 0 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    num_edges = topk_ids.numel()
    max_padded, max_blocks = align_sizes(num_edges, num_experts, block_m)
    dev = topk_ids.device
    sorted_ids = torch.empty(max(max_padded, 1), dtype=torch.int32, device=dev)
    block_expert = torch.empty(max(max_blocks, 1), dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    e_pad = triton.next_power_of_2(num_experts + 1)
    chunk = max(16, min(1024, triton.next_power_of_2(max(num_edges, max_blocks, 1))))
    _moe_align_kernel[(1,)](
        topk_ids.reshape(-1), sorted_ids, block_expert, num_padded,
        num_edges, num_experts, max_padded, max_blocks,
        BLOCK_M=block_m, E_PAD=e_pad, CHUNK=chunk, CHUNK_B=max(16, 8192 // e_pad), num_warps=8 if chunk >= 512 else 4,
    )
    return sorted_ids, block_expert, num_padded
