"""Test helpers every area shares: a tiny locally built model and a real `vllm serve` on loopback."""
