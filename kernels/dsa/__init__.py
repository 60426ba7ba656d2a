"""DSA (DeepSeek sparse attention) kernels: the FP8 lightning indexer and its per-row top-k."""

from zoe_kernels.dsa.indexer import indexer_topk, lightning_indexer

__all__ = ["indexer_topk", "lightning_indexer"]
