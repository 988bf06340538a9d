"""A draft's accept length on a known greedy output, in one forward pass per prompt.

At temperature 0 the lossless verifier commits exactly the target's greedy output R, whatever
the draft proposes; the draft only decides how many verify steps that takes. So the count can be
replayed without decoding: one forward of the target over prompt + R gives its EAGLE-3 features
at every position (and checks, by its argmax, that R is its greedy output), and one forward of
the draft in speculators' own training form (``Eagle3DraftModel.forward`` with ``ttt_steps``)
gives, at every position, the chain the draft proposes when the committed text ends there:
step 0 reads the target's feature of position i and token i + 1, each later step its own
hidden state and the next token. Teacher forcing the next token is exact here: a chain's later
proposal only counts while every earlier one equalled R's token. The verify steps then follow
by walking R: a step accepts the proposals that match R and adds the target's own next token.

It is the same arithmetic as the emulator's speculating loop (``sglang_emulator_transformers``)
batched over positions, so float rounding can differ; real_measure.py runs both on a sample
and reports every prompt where they disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sglang_emulator_transformers import draft_to_target


@dataclass(frozen=True, slots=True)
class Reference:
    """A prompt, the target's greedy output after it, and the target's features of both."""

    prompt: list[int]
    output: list[int]
    features: torch.Tensor  # [len(prompt) + len(output), aux layers * hidden]
    greedy_breaks: int  # output positions where the target's argmax is another token


def reference(
    model: torch.nn.Module, aux_layers: tuple[int, ...], prompt: list[int], output: list[int]
) -> Reference:
    """The target's features over ``prompt + output`` (the inputs of ``aux_layers``, as the
    emulator's target gives them) and how often ``output`` is not its argmax."""
    ids = prompt + output
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    features = torch.cat([out.hidden_states[i][0] for i in aux_layers], dim=-1)
    guess = out.logits[0, len(prompt) - 1 : len(ids) - 1].argmax(-1).tolist()
    breaks = sum(g != t for g, t in zip(guess, output, strict=True))
    return Reference(list(prompt), list(output), features, breaks)


def load_draft(path: Path) -> torch.nn.Module:
    """A speculators EAGLE-3 checkpoint with sdpa attention: a checkpoint does not record the
    attention it was trained with, and speculators' default (flex attention) builds a block mask
    of 128-position blocks that a sequence of another length cannot use on CPU."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = "sdpa"
    return Eagle3DraftModel.from_pretrained(str(path), config=config, dtype=torch.float32).eval()


def chains(draft: torch.nn.Module, ref: Reference, steps: int) -> list[list[int]]:
    """``chains[t][i]``: the target id the draft proposes for position ``i + t + 2`` when the
    committed text ends at position ``i + 1`` (speculators' shifted alignment)."""
    ids = ref.prompt + ref.output
    n = len(ids) - 1
    with torch.no_grad():
        tokens = draft(
            hidden_states=ref.features[:-1].unsqueeze(0),
            input_ids=torch.tensor([ids[1:]]),
            document_ids=torch.zeros(1, n, dtype=torch.long),
            position_ids=torch.arange(1, n + 1).unsqueeze(0),
            ttt_steps=steps,
        )
    to_target = draft_to_target(draft)
    return [to_target[t[0]].tolist() for t in tokens]


def walk(ref: Reference, proposed: list[list[int]]) -> tuple[int, int]:
    """(tokens committed, verify steps) of the speculating loop on ``ref``: the first token
    comes from the prefill, each verify step commits the matching proposals and one more."""
    ids = ref.prompt + ref.output
    n, last = len(ids), len(ref.prompt)  # ``last``: the index of the last committed token
    steps = 0
    while last + 1 - len(ref.prompt) < len(ref.output):
        steps += 1
        accepted = 0
        for t, chain in enumerate(proposed):
            position = last + 1 + t
            if position >= n or chain[last - 1] != ids[position]:
                break
            accepted += 1
        last += accepted + 1
    return len(ref.output), steps
