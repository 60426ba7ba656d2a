"""Weight and activation formats of the fused MoE: quantize/pack helpers and their exact inverses.

All weights keep vLLM's `fused_experts` layout, `w13 [E, 2I, H]` (rows: gate then up) and `w2 [E, H, I]`,
with the quantized axis K (the last one, the reduction axis of `x @ w.T`):

| fmt     | weight tensor                          | scale tensor                                   |
|---------|----------------------------------------|------------------------------------------------|
| `bf16`  | activation dtype, `[E, N, K]`          | none                                           |
| `fp8`   | e4m3 (platform flavour), `[E, N, K]`   | fp32 `[E, ceil(N/128), ceil(K/128)]` (128x128) |
| `w4a16` | uint8 `[E, N, ceil(K/2)]`, 2 int4 each | float `[E, N, ceil(K/128)]` (group of 128)     |
| `mxfp4` | uint8 `[E, N, ceil(K/2)]`, 2 e2m1 each | uint8 e8m0 `[E, N, ceil(K/32)]` (group of 32)  |

Packing: the low nibble holds the even k, the high nibble the odd k. int4 is symmetric with an implicit
zero point of 8 (stored nibble u means (u - 8) * scale). e2m1 nibbles are sign | exponent(2) | mantissa(1);
e8m0 byte b means 2**(b - 127). FP8 activations are scaled per token and group of 128 along K (DeepSeek-V3).
"""

from __future__ import annotations

import torch

from zoe_kernels.platform import fp8_dtype, fp8_max

FP8_BLOCK = 128  # weight block (rows and columns) and activation group of the fp8 format
INT4_GROUP = 128  # K group of the w4a16 scales
MX_GROUP = 32  # K group of one e8m0 scale (OCP microscaling)
FORMATS = ("bf16", "fp8", "w4a16", "mxfp4")

# The 8 non-negative e2m1 magnitudes, indexed by the 3 low bits of a nibble.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pad_last(t: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-t.shape[-1]) % multiple
    return torch.nn.functional.pad(t, (0, pad)) if pad else t


def quantize_fp8_block(w: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] float -> (fp8 [E, N, K], fp32 scales [E, ceil(N/128), ceil(K/128)]), amax per 128x128 block."""
    dtype = dtype or fp8_dtype(w.device)
    e, n, k = w.shape
    wf = w.float()
    wp = torch.nn.functional.pad(wf, (0, (-k) % FP8_BLOCK, 0, (-n) % FP8_BLOCK))
    nb, kb = wp.shape[1] // FP8_BLOCK, wp.shape[2] // FP8_BLOCK
    blocks = wp.view(e, nb, FP8_BLOCK, kb, FP8_BLOCK)
    amax = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-12)
    scale = amax / fp8_max(dtype)
    q = (blocks / scale[:, :, None, :, None]).clamp(-fp8_max(dtype), fp8_max(dtype))
    q = q.view(e, nb * FP8_BLOCK, kb * FP8_BLOCK)[:, :n, :k].to(dtype)
    return q.contiguous(), scale.contiguous()


def dequantize_fp8_block(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_fp8_block`, in float32."""
    n, k = q.shape[-2:]
    s = scale.repeat_interleave(FP8_BLOCK, dim=-2)[..., :n, :].repeat_interleave(FP8_BLOCK, dim=-1)[..., :k]
    return q.float() * s


def quantize_act_fp8_torch(x: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K] float -> (fp8 [R, K], fp32 scales [R, ceil(K/128)]): one scale per token and group of 128."""
    dtype = dtype or fp8_dtype(x.device)
    r, k = x.shape
    xp = _pad_last(x.float(), FP8_BLOCK).view(r, -1, FP8_BLOCK)
    scale = xp.abs().amax(dim=-1).clamp_min(1e-10) / fp8_max(dtype)
    q = (xp / scale[..., None]).clamp(-fp8_max(dtype), fp8_max(dtype)).view(r, -1)[:, :k].to(dtype)
    return q.contiguous(), scale.contiguous()


def dequantize_act_fp8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `quantize_act_fp8_torch`, in float32."""
    k = q.shape[-1]
    return q.float() * scale.repeat_interleave(FP8_BLOCK, dim=-1)[..., :k]


def _pack_nibbles(u: torch.Tensor) -> torch.Tensor:
    """uint8 values in [0, 16) along the last axis -> bytes holding two of them (low nibble = even k)."""
    u = _pad_last(u, 2)
    return (u[..., 0::2] | (u[..., 1::2] << 4)).contiguous()


def _unpack_nibbles(p: torch.Tensor, k: int) -> torch.Tensor:
    lo, hi = p & 0xF, p >> 4
    return torch.stack((lo, hi), dim=-1).flatten(-2)[..., :k]


def quantize_int4_group(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] float -> (uint8 [E, N, ceil(K/2)], fp32 scales [E, N, ceil(K/group)]), symmetric int4."""
    k = w.shape[-1]
    wg = _pad_last(w.float(), group).unflatten(-1, (-1, group))
    scale = wg.abs().amax(dim=-1).clamp_min(1e-12) / 7.0
    q = torch.round(wg / scale[..., None]).clamp(-8, 7).flatten(-2)[..., :k]
    return _pack_nibbles((q + 8).to(torch.uint8)), scale.contiguous()


def dequantize_int4_group(packed: torch.Tensor, scale: torch.Tensor, k: int, group: int = INT4_GROUP) -> torch.Tensor:
    """Inverse of `quantize_int4_group`, in float32; `k` is the unpacked length of the last axis."""
    q = _unpack_nibbles(packed, k).float() - 8.0
    return q * scale.float().repeat_interleave(group, dim=-1)[..., :k]


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] float -> (uint8 e2m1 pairs [E, N, ceil(K/2)], uint8 e8m0 scales [E, N, ceil(K/32)]).

    The shared exponent is floor(log2(amax)) - 2, so the group's largest value lands in [4, 8) before
    rounding to the nearest e2m1 value (saturating at 6), as in the OCP MX recipe.
    """
    k = w.shape[-1]
    wg = _pad_last(w.float(), MX_GROUP).unflatten(-1, (-1, MX_GROUP))
    amax = wg.abs().amax(dim=-1)
    exp = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(2.0**-126))) - 2, torch.full_like(amax, -127))
    exp = exp.clamp(-127, 127)
    v = (wg / torch.exp2(exp)[..., None]).flatten(-2)[..., :k]
    grid = torch.tensor(E2M1_VALUES, device=w.device)
    code = (v.abs()[..., None] - grid).abs().argmin(dim=-1).to(torch.uint8)  # ties go to the smaller magnitude
    nib = code | ((v < 0) & (code > 0)).to(torch.uint8) << 3
    return _pack_nibbles(nib), (exp + 127).to(torch.uint8).contiguous()


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of `quantize_mxfp4`, in float32; `k` is the unpacked length of the last axis."""
    nib = _unpack_nibbles(packed, k).long()
    grid = torch.tensor(E2M1_VALUES, device=packed.device)
    v = grid[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    s = torch.exp2(scale.float() - 127.0).repeat_interleave(MX_GROUP, dim=-1)[..., :k]
    return v * s


def quantize_weights(w: torch.Tensor, fmt: str, act_dtype: torch.dtype = torch.bfloat16):
    """One weight tensor [E, N, K] in `fmt`: returns (weight, scale or None)."""
    if fmt == "bf16":
        return w.to(act_dtype).contiguous(), None
    if fmt == "fp8":
        return quantize_fp8_block(w)
    if fmt == "w4a16":
        return quantize_int4_group(w)
    if fmt == "mxfp4":
        return quantize_mxfp4(w)
    raise ValueError(f"unknown MoE format {fmt!r}; expected one of {FORMATS}")


def dequantize_weights(w: torch.Tensor, scale: torch.Tensor | None, fmt: str, k: int) -> torch.Tensor:
    """float32 [E, N, K] from a weight in `fmt` (`k`: the unpacked K)."""
    if fmt == "bf16":
        return w.float()
    if fmt == "fp8":
        return dequantize_fp8_block(w, scale)
    if fmt == "w4a16":
        return dequantize_int4_group(w, scale, k)
    if fmt == "mxfp4":
        return dequantize_mxfp4(w, scale, k)
    raise ValueError(f"unknown MoE format {fmt!r}; expected one of {FORMATS}")


def weight_k(w: torch.Tensor, fmt: str) -> int:
    """Upper bound of the unpacked K of a weight (2 values per byte in the 4-bit formats)."""
    return w.shape[-1] * 2 if fmt in ("w4a16", "mxfp4") else w.shape[-1]
