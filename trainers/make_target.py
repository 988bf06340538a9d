"""The harness's only stand-in: a tiny random Llama target (the real target is Kimi-K2.5).

Hidden 64, 4 layers, 4 heads / 2 KV heads, vocab 688 (the bundled Kimi-K2.5-style tokenizer,
saved with it). lm_head is scaled x50: a random init predicts a near-uniform next token
(entropy 6.52 nats vs 6.53 uniform), which a KL loss can barely learn; scaled, its
distributions are peaked and a falling loss means the draft learned something. Also writes
model.safetensors.index.json, which SpecForge's TargetHead requires. No downloads.

usage: python make_target.py TOKENIZER_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM


def main(tokenizer_dir: str, out_dir: str) -> None:
    out = Path(out_dir)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
    config = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=688,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
        torch_dtype="float32",
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(50.0)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    names = list(load_file(out / "model.safetensors"))
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    print(f"target: {out} ({sum(p.numel() for p in model.parameters())} parameters)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
