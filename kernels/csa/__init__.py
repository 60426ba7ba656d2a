"""CSA (compressed sparse attention, DeepSeek-V4) kernels: top-K selection and dual-scope decode."""

from zoe_kernels.csa.dual_scope_decode import dual_scope_decode
from zoe_kernels.csa.paged_dual_scope import paged_dual_scope_decode
from zoe_kernels.csa.topk import topk, topk_ranges

__all__ = ["dual_scope_decode", "paged_dual_scope_decode", "topk", "topk_ranges"]
