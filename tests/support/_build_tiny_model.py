"""Builds a tiny random-weight model and tokenizer into a folder. Runs under the vllm venv's python
(which has transformers + tokenizers), not zoe's: `python _build_tiny_model.py OUT_DIR ARCH`.

Tokenizer: byte-level BPE (vocab 2048) trained on generated text, ChatML chat template.
Model: bf16 with random weights, small enough to load in a second on a CPU.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

VOCAB = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = (
    "the of and to in is was for on that with as by at from his her they which this be are an or had not "
    "but what all were when we there can more if no man out other so time up about into only new some "
    "could these two may then first any like now my such make over our even most me state after also "
    "model token expert router cache prefix replica decode prefill latency throughput gpu node kernel "
    "attention sparse index batch request user system assistant hello world number zero one two three"
).split()


def corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 24))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 99999)))
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ","]))
    return lines


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    fast.model_max_length = 4096
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, arch: str, tokenizer) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    common = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    if arch == "llama":
        cfg = AutoConfig.for_model("llama", **common)
    elif arch == "qwen3_moe":
        cfg = AutoConfig.for_model(
            "qwen3_moe", **common, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
            decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[],
        )
    else:
        raise SystemExit(f"unknown arch {arch!r}: use llama or qwen3_moe")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)


def main() -> None:
    out, arch = Path(sys.argv[1]), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out)
    build_model(out, arch, tok)


if __name__ == "__main__":
    main()
