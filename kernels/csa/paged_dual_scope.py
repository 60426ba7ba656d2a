"""CSA dual-scope decode read straight from a paged FP8 KV pool (DeepSeek-V4's FlashMLA "V4" layout).

The same attention as `zoe_kernels.csa.dual_scope_decode` (one query token per sequence over its sliding
window plus its CSA-selected compressed entries, MQA, optional attention sink), but the entries are not
passed as contiguous tensors: each scope is a paged byte pool plus a slot list per sequence, and the
kernel dequantizes each entry on load. Nothing proportional to the context is gathered or copied.

    entries(b) = { pool_s[slot] : slot = idx_s[b, j], j < len_s[b], slot >= 0 }   for scope s in (swa, extra)
    K_e = V_e  = dequant(entry)                                  (MLA latent: values are the keys, D = 512)
    out[b, h]  = sum_e softmax_e(sm_scale * q[b, h] . K_e) V_e   (softmax over both scopes and the sink)
    lse[b, h]  = log sum_e exp(sm_scale * q[b, h] . K_e)         (natural log, sink excluded; +inf if empty)

Pool layout (SGLang's `DeepSeekV4SingleKVPool` with `KVLayout.V4`, FlashMLA's MODEL1 FP8 sparse format),
per page of P tokens, padded up to a multiple of 576 bytes:

    [token 0..P-1: 448 fp8 e4m3 "nope" values + 64 bf16 "rope" values = 576 bytes each]
    [token 0..P-1: 7 ue8m0 scales (one per 64 nope values, 2**(byte - 127)) + 1 pad byte = 8 bytes each]

A slot is `page * P + offset`. The cache argument is the view SGLang hands FlashMLA,
`buf[:, :P * 584].view(num_pages, P, 1, 584)` of the pool's `[num_pages, page_bytes]` uint8 buffer
(`flashmla_view` builds it); the page stride is read from the view. Dequantized keys are exact in bf16
(an e4m3 value times a power of two), so bf16 dots lose nothing on K; P is rounded to the dot dtype.

Work split as in `dual_scope_decode`: programs (sequence, head block, split) take contiguous runs of entry
tiles (window tiles first, then extra tiles), run a base-2 online softmax, and a second launch merges the
splits exactly and adds the sink.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from zoe_kernels.csa.dual_scope_decode import _CU_WAVES, merge_partials_kernel
from zoe_kernels.platform import current_target, dot_precision, sm_count

D_NOPE, D_ROPE, NOPE_TILE = 448, 64, 64
D_QK = D_NOPE + D_ROPE  # 512
DATA_BYTES = D_NOPE + 2 * D_ROPE  # 576: the nope + rope row of one token
SCALE_BYTES = D_NOPE // NOPE_TILE + 1  # 8: 7 ue8m0 scales + 1 pad
BYTES_PER_TOKEN = DATA_BYTES + SCALE_BYTES  # 584
PAGE_ALIGN = 576
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


def page_bytes(page_size: int) -> int:
    """Bytes of one pool page of `page_size` tokens (padded to a multiple of 576, as SGLang allocates it)."""
    return -(-page_size * BYTES_PER_TOKEN // PAGE_ALIGN) * PAGE_ALIGN


def flashmla_view(buf: torch.Tensor, page_size: int) -> torch.Tensor:
    """The [num_pages, page_size, 1, 584] view of a [num_pages, page_bytes] pool buffer that SGLang passes."""
    return buf[:, : page_size * BYTES_PER_TOKEN].view(buf.shape[0], page_size, 1, BYTES_PER_TOKEN)


@triton.jit
def _scope_rows(idx_ptr, len_ptr, b, j, stride_ib, K, page_size, page_stride, HAS_LEN: tl.constexpr):
    """(valid, data row byte offset, scale row byte offset) of entries j of sequence b in one scope."""
    n = K
    if HAS_LEN:
        n = tl.minimum(tl.load(len_ptr + b), K)
    sel = tl.load(idx_ptr + b.to(tl.int64) * stride_ib + j, mask=j < n, other=-1)
    ok = sel >= 0
    slot = tl.maximum(sel, 0).to(tl.int64)
    page = slot // page_size
    off = slot - page * page_size
    base = page * page_stride
    return ok, base + off * 576, base + page_size * 576 + off * 8


@triton.jit
def _paged_partial_kernel(
    q_ptr, swa_u8, swa_f8, swa_bf, swa_idx_ptr, swa_len_ptr, ext_u8, ext_f8, ext_bf, ext_idx_ptr, ext_len_ptr,
    part_out_ptr, part_lse_ptr,
    H, K_SWA, K_EXT, swa_page_size, ext_page_size, swa_page_stride, ext_page_stride, qk_scale_log2,
    stride_qb, stride_qh, stride_sib, stride_eib,
    BH: tl.constexpr, BKV: tl.constexpr, TILES_PER_SPLIT: tl.constexpr,
    SWA_LEN: tl.constexpr, EXT_LEN: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    heads = hb * BH + tl.arange(0, BH)
    h_ok = heads < H
    dd = tl.arange(0, 512)
    is_nope = dd < 448
    tile_of = tl.minimum(dd // 64, 6)
    rope_col = tl.maximum(dd - 448, 0)
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + dd[None, :],
                mask=h_ok[:, None], other=0.0).to(tl.float32).to(DOT_DTYPE)
    swa_tiles = tl.cdiv(K_SWA, BKV)

    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, 512], tl.float32)
    for t in range(split * TILES_PER_SPLIT, (split + 1) * TILES_PER_SPLIT):
        e = tl.arange(0, BKV)
        # window tiles first, then extra (compressed) tiles; a tile never mixes the two
        if t < swa_tiles:
            ok, row, srow = _scope_rows(swa_idx_ptr, swa_len_ptr, b, t * BKV + e, stride_sib, K_SWA,
                                        swa_page_size, swa_page_stride, SWA_LEN)
            u8, f8, bf = swa_u8, swa_f8, swa_bf
        else:
            ok, row, srow = _scope_rows(ext_idx_ptr, ext_len_ptr, b, (t - swa_tiles) * BKV + e, stride_eib, K_EXT,
                                        ext_page_size, ext_page_stride, EXT_LEN)
            u8, f8, bf = ext_u8, ext_f8, ext_bf
        if tl.max(ok.to(tl.int32), axis=0) > 0:  # skip tiles past the lengths or of -1 slots only
            # dequantize on load: nope = fp8 * 2**(ue8m0 - 127) per 64 values, rope is bf16 as stored
            nope_m = ok[:, None] & is_nope[None, :]
            nope = tl.load(f8 + row[:, None] + dd[None, :], mask=nope_m, other=0.0).to(tl.float32)
            sbyte = tl.load(u8 + srow[:, None] + tile_of[None, :], mask=nope_m, other=127).to(tl.int32)
            scale = (sbyte << 23).to(tl.float32, bitcast=True)
            rope = tl.load(bf + (row // 2 + 224)[:, None] + rope_col[None, :], mask=ok[:, None] & (dd >= 448)[None, :],
                           other=0.0).to(tl.float32)
            kt = tl.where(is_nope[None, :], nope * scale, rope).to(DOT_DTYPE)  # [BKV, 512], exact in bf16
            s = tl.dot(q, tl.trans(kt), input_precision=PRECISION) * qk_scale_log2  # [BH, BKV], log2 units
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), kt, input_precision=PRECISION)
            m_i = m_new

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
    base = (b.to(tl.int64) * num_splits + split) * H
    tl.store(part_out_ptr + (base + heads)[:, None] * 512 + dd[None, :], out, mask=h_ok[:, None])
    tl.store(part_lse_ptr + base + heads, lse, mask=h_ok)


# Programs per multiprocessor/CU the entry splits aim at (two: 264 on an H200). Retune by timing `splits` at B=1.
_PROGRAMS_PER_SM = 2
_DOT_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
_FP8_VIEWS = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _check_scope(name: str, cache: torch.Tensor, idx: torch.Tensor, lengths: torch.Tensor | None, bsz: int):
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != BYTES_PER_TOKEN or cache.element_size() != 1:
        raise ValueError(f"{name} cache must be the [pages, page_size, 1, {BYTES_PER_TOKEN}] byte view of a V4 pool, "
                         f"got {tuple(cache.shape)} {cache.dtype}")  # fmt: skip
    if cache.stride(3) != 1 or cache.stride(1) != BYTES_PER_TOKEN or cache.stride(0) < page_bytes(cache.shape[1]):
        raise ValueError(f"{name} cache strides {cache.stride()} are not a V4 pool's pages")
    if idx.dim() != 2 or idx.shape[0] != bsz:
        raise ValueError(f"{name} indices must be [B={bsz}, k], got {tuple(idx.shape)}")
    if lengths is not None and lengths.shape != (bsz,):
        raise ValueError(f"{name} lengths must be [B={bsz}], got {tuple(lengths.shape)}")


def _views(cache: torch.Tensor, fp8_dtype: torch.dtype):
    """uint8, fp8 and bf16 views of one pool (same bytes); the bf16 view's offsets are bytes // 2."""
    u8 = cache.view(torch.uint8)
    return u8, u8.view(fp8_dtype), u8.view(torch.bfloat16)


def paged_dual_scope_decode(
    q: torch.Tensor, swa_cache: torch.Tensor, swa_indices: torch.Tensor, swa_lengths: torch.Tensor | None = None,
    extra_cache: torch.Tensor | None = None, extra_indices: torch.Tensor | None = None,
    extra_lengths: torch.Tensor | None = None, *, sink: torch.Tensor | None = None, sm_scale: float | None = None,
    fp8_dtype: torch.dtype = torch.float8_e4m3fn, splits: int | None = None, block_h: int | None = None,
    block_kv: int = 32, num_warps: int | None = None, num_stages: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of one query token per sequence over paged window entries plus paged extra entries.

    q: [B, H, 512] bf16, fp16 or fp32. swa_cache / extra_cache: [pages, P, 1, 584] byte views of V4 pools
    (`flashmla_view`; the two may have different page sizes). swa_indices / extra_indices: [B, k] int32
    slots (`page * P + offset`), -1 skipped; swa_lengths / extra_lengths: [B] int32, entries j >= length
    skipped (None: all k). sink: [H] float32 logits or None; sm_scale defaults to 1/sqrt(512). fp8_dtype:
    how the pool's fp8 bytes are read (e4m3fn on CUDA and gfx950, e4m3fnuz on gfx942).
    Returns (out [B, H, 512] in q's dtype, lse [B, H] float32, natural log, +inf for a row with no entry;
    such a row's output is zeros).
    """
    if q.dim() != 3 or q.shape[2] != D_QK:
        raise ValueError(f"q must be [B, H, {D_QK}], got {tuple(q.shape)}")
    if q.dtype not in _DOT_DTYPES:
        raise ValueError(f"q must be bf16, fp16 or fp32, got {q.dtype}")
    if fp8_dtype not in _FP8_VIEWS:
        raise ValueError(f"fp8_dtype must be one of {_FP8_VIEWS}, got {fp8_dtype}")
    bsz, heads, _ = q.shape
    _check_scope("swa", swa_cache, swa_indices, swa_lengths, bsz)
    has_extra = extra_cache is not None
    if has_extra:
        if extra_indices is None:
            raise ValueError("extra_cache needs extra_indices")
        _check_scope("extra", extra_cache, extra_indices, extra_lengths, bsz)
    if sink is not None and sink.shape != (heads,):
        raise ValueError(f"sink must be [H={heads}], got {tuple(sink.shape)}")
    dev = q.device
    q = q if q.stride(2) == 1 else q.contiguous()

    def ints(t):
        return t.to(device=dev, dtype=torch.int32).contiguous()

    swa_idx = ints(swa_indices)
    ext_idx = ints(extra_indices) if has_extra else swa_idx[:, :0]
    swa_len = ints(swa_lengths) if swa_lengths is not None else swa_idx
    ext_len = ints(extra_lengths) if has_extra and extra_lengths is not None else swa_idx
    swa_views = _views(swa_cache, fp8_dtype)
    ext_views = _views(extra_cache, fp8_dtype) if has_extra else swa_views
    ext_page_size = extra_cache.shape[1] if has_extra else 1
    ext_page_stride = extra_cache.stride(0) if has_extra else 0

    if block_h is None:
        block_h = 16 if bsz < 8 else 32
    if num_warps is None:  # wave64 (CDNA): one wave per SIMD, whose 8-wave programs spill (dual_scope_decode._CU_WAVES)
        num_warps = _CU_WAVES if current_target().warp_size == 64 else 4 if block_h <= 16 else 8
    block_h = max(16, min(block_h, triton.next_power_of_2(heads)))
    head_blocks = triton.cdiv(heads, block_h)
    k_swa, k_ext = swa_idx.shape[1], ext_idx.shape[1]
    tiles = max(1, triton.cdiv(k_swa, block_kv) + triton.cdiv(k_ext, block_kv))
    if splits is None:  # enough programs to cover the GPU's multiprocessors about twice
        splits = max(1, min(tiles, triton.cdiv(_PROGRAMS_PER_SM * sm_count(dev.index or 0), max(bsz, 1) * head_blocks)))
    splits = max(1, min(splits, tiles))
    tiles_per_split = triton.cdiv(tiles, splits)
    splits = triton.cdiv(tiles, tiles_per_split)
    out = torch.empty((bsz, heads, D_QK), dtype=q.dtype, device=dev)
    lse = torch.empty((bsz, heads), dtype=torch.float32, device=dev)
    if bsz == 0:
        return out, lse
    part_out = torch.empty((bsz, splits, heads, D_QK), dtype=torch.float32, device=dev)
    part_lse = torch.empty((bsz, splits, heads), dtype=torch.float32, device=dev)
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(D_QK)
    _paged_partial_kernel[(bsz, head_blocks, splits)](
        q, *swa_views, swa_idx, swa_len, *ext_views, ext_idx, ext_len, part_out, part_lse,
        heads, k_swa, k_ext, swa_cache.shape[1], ext_page_size, swa_cache.stride(0), ext_page_stride,
        scale * _LOG2E, q.stride(0), q.stride(1), swa_idx.stride(0), max(ext_idx.stride(0), 1),
        BH=block_h, BKV=block_kv, TILES_PER_SPLIT=tiles_per_split,
        SWA_LEN=swa_lengths is not None, EXT_LEN=has_extra and extra_lengths is not None,
        DOT_DTYPE=_DOT_DTYPES[q.dtype], PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    sink_t = sink.to(device=dev, dtype=torch.float32).contiguous() if sink is not None else part_lse
    merge_partials_kernel[(bsz, head_blocks)](
        part_out, part_lse, sink_t, out, lse, heads, splits, out.stride(0), out.stride(1),
        D=512, BH=block_h, SPLITS_P2=triton.next_power_of_2(splits), HAS_SINK=sink is not None, WRITE_LSE=True,
        num_warps=4,
    )  # fmt: skip
    return out, lse


# -- the pool's bytes, for tests and benchmarks ----------------------------------------------------------------
def quantize_v4_rows(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, 512] float keys -> (nope fp8 e4m3 [N, 448], rope bf16 [N, 64], ue8m0 scale bytes [N, 7]), the way
    DeepSeek-V4's cache stores them: per 64 nope values the power-of-two scale 2**ceil(log2(amax / 448))."""
    k = k.float()
    nope, rope = k[:, :D_NOPE], k[:, D_NOPE:]
    tiles = nope.reshape(-1, D_NOPE // NOPE_TILE, NOPE_TILE)
    amax = tiles.abs().amax(dim=-1).clamp(min=1e-4)
    exp = torch.ceil(torch.log2(amax / 448.0))
    fp8 = (tiles / torch.exp2(exp)[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).reshape(-1, D_NOPE)
    return fp8, rope.to(torch.bfloat16), (exp + 127).to(torch.uint8)


def write_v4_pool(buf: torch.Tensor, page_size: int, slots: torch.Tensor, nope_fp8: torch.Tensor,
                  rope_bf16: torch.Tensor, scale_ue8m0: torch.Tensor) -> None:
    """Store tokens at `slots` of a [num_pages, page_bytes] uint8 V4 pool buffer (PyTorch; tests/benchmarks)."""
    slots = slots.long().cpu()
    page, off = slots // page_size, slots % page_size
    data = torch.cat([nope_fp8.view(torch.uint8), rope_bf16.contiguous().view(torch.uint8)], dim=1)  # [N, 576]
    cols = torch.arange(DATA_BYTES)
    flat = buf.view(-1)
    stride = buf.stride(0)
    dev = buf.device
    flat[((page * stride + off * DATA_BYTES)[:, None] + cols).to(dev)] = data.to(dev)
    scols = torch.arange(SCALE_BYTES - 1)  # the pad byte is left as it is, as SGLang's store kernel does
    flat[((page * stride + page_size * DATA_BYTES + off * SCALE_BYTES)[:, None] + scols).to(dev)] = scale_ue8m0.to(dev)


def dequant_v4_slots(cache: torch.Tensor, slots: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn):
    """Float64 [N, 512] keys of `slots` read from a [pages, P, 1, 584] V4 pool view (the test reference)."""
    page_size, stride = cache.shape[1], cache.stride(0)
    flat = torch.as_strided(cache.view(torch.uint8), (cache.shape[0] * stride,), (1,)).cpu()
    slots = slots.long().cpu()
    page, off = slots // page_size, slots % page_size
    row = page * stride + off * DATA_BYTES
    nope = flat[row[:, None] + torch.arange(D_NOPE)].view(fp8_dtype).double()
    rope = flat[row[:, None] + D_NOPE + torch.arange(2 * D_ROPE)].view(torch.bfloat16).double()
    sbytes = flat[(page * stride + page_size * DATA_BYTES + off * SCALE_BYTES)[:, None] + torch.arange(7)]
    scale = torch.exp2(sbytes.double() - 127).repeat_interleave(NOPE_TILE, dim=1)
    return torch.cat([nope * scale, rope], dim=1)


def paged_dual_scope_decode_reference(q, swa_cache, swa_indices, swa_lengths=None, extra_cache=None,
                                      extra_indices=None, extra_lengths=None, *, sink=None, sm_scale=None,
                                      fp8_dtype=torch.float8_e4m3fn):  # fmt: skip
    """Float64 reference of `paged_dual_scope_decode` (same arguments), from the pools' bytes: (out, lse)."""
    bsz, heads, d = q.shape
    scale = sm_scale if sm_scale is not None else d**-0.5
    out = torch.zeros((bsz, heads, d), dtype=torch.float64)
    lse = torch.full((bsz, heads), float("inf"), dtype=torch.float64)
    qd = q.detach().cpu().double()
    scopes = [(swa_cache, swa_indices, swa_lengths)]
    if extra_cache is not None:
        scopes.append((extra_cache, extra_indices, extra_lengths))
    for b in range(bsz):
        keys = []
        for cache, idx, lengths in scopes:
            sel = idx[b].cpu().long()
            if lengths is not None:
                sel = sel[: int(lengths[b])]
            keys.append(dequant_v4_slots(cache, sel[sel >= 0], fp8_dtype))
        kv = torch.cat(keys)
        logits = qd[b] @ kv.T * scale  # [H, E]
        if kv.shape[0]:
            lse[b] = torch.logsumexp(logits, dim=1)
        if sink is not None:
            logits = torch.cat([logits, sink.detach().cpu().double()[:, None]], dim=1)
            kv = torch.cat([kv, torch.zeros(1, d, dtype=torch.float64)])
        if logits.shape[1]:
            out[b] = torch.softmax(logits, dim=1) @ kv
    return out, lse
