"""The lab's tiny target: a real 4-layer Llama (transformers), trained briefly from scratch on
corpus.py's chat answers so that its greedy output depends on the prompt and follows the chat
format (reasoning, ``</think>``, answer, ``<|im_end|>``). No downloads.

Same shape rules as trainers/make_target.py (hidden states of layers 1-3 for EAGLE-3, the
bundled Kimi-K2.5-style tokenizer saved with it, model.safetensors.index.json), with a
larger hidden size so that a few minutes on one CPU thread teach it something. Deterministic:
seed 0, a fixed number of steps, one thread.

With ``modes`` (the modes table, issue #34): every training answer twice, once in each of
Kimi-K2.5's serving modes, so the target serves both as the real one does: *thinking* (the
generation prompt ends in ``<think>``; reasoning, ``</think>``, answer) and *instant* (the
template's ``thinking=False``: the prompt ends in ``<think></think>``; the answer alone).

usage: python make_target.py TOKENIZER_DIR TARGET_TRAIN_JSONL OUT_DIR [STEPS [modes]]
"""

import json
import random
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

BATCH = 16
LR = 3e-3


def encode(tok, row: dict, thinking: bool = True) -> tuple[list[int], int]:
    """The conversation's ids and where the answer starts (loss on the answer only)."""
    kwargs = {} if thinking else {"thinking": False}
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": row["question"]}],
        tokenize=False,
        add_generation_prompt=True,
        **kwargs,
    )
    answer = f"{row['answer']}<|im_end|>"
    if thinking:
        answer = f"{row['reasoning']}</think>{answer}"
    p = tok(prompt, add_special_tokens=False).input_ids
    a = tok(answer, add_special_tokens=False).input_ids
    return p + a, len(p)


def build(tok) -> LlamaForCausalLM:
    config = LlamaConfig(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=352,
        vocab_size=len(tok),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        torch_dtype="float32",
        bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    )
    return LlamaForCausalLM(config)


def batches(rows: list[tuple[list[int], int]], rng: random.Random):
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        for i in range(0, len(order) - BATCH + 1, BATCH):
            chunk = [rows[j] for j in order[i : i + BATCH]]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.zeros(BATCH, width, dtype=torch.long)
            labels = torch.full((BATCH, width), -100, dtype=torch.long)
            mask = torch.zeros(BATCH, width, dtype=torch.long)
            for b, (seq, start) in enumerate(chunk):
                ids[b, : len(seq)] = torch.tensor(seq)
                labels[b, start : len(seq)] = torch.tensor(seq[start:])
                mask[b, : len(seq)] = 1
            yield ids, labels, mask


def main(
    tokenizer_dir: str, train_jsonl: str, out_dir: str, steps: int = 300, modes: str = ""
) -> None:
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tokenizer_dir, trust_remote_code=True)
    answers = [json.loads(x) for x in Path(train_jsonl).read_text().splitlines()]
    rows = [encode(tok, row) for row in answers]
    if modes == "modes":
        rows += [encode(tok, row, thinking=False) for row in answers]
    elif modes:
        raise SystemExit(f"make_target.py: unknown option {modes!r} (only 'modes')")
    model = build(tok)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=steps, pct_start=0.1)
    start = time.monotonic()
    model.train()
    for step, (ids, labels, mask) in zip(
        range(steps), batches(rows, random.Random(0)), strict=False
    ):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 25 == 0 or step == steps - 1:
            took = time.monotonic() - start
            print(f"step {step} loss {loss.item():.3f} ({took:.0f} s)", flush=True)
    model.eval()
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    names = list(load_file(out / "model.safetensors"))
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    n = sum(p.numel() for p in model.parameters())
    print(f"target: {out} ({n} parameters, {steps} steps, final loss {loss.item():.3f})")


if __name__ == "__main__":
    main(*sys.argv[1:4], *(int(a) for a in sys.argv[4:5]), *sys.argv[5:6])
