"""The output logprobs SGLang 0.5.23's scheduler attaches to a request's tokens, for the fake
engine (`conformance/fake_engine.py`): made-up logits, SGLang's own arithmetic on them.

Only the logits are invented (deterministic per prompt and position; the fake model has chosen
the tokens already, so each row's logits are built around its token). Everything after is
SGLang's path for a decode step with ``return_logprob`` (paths in the wheel, under
``sglang/srt/``):

- ``layers/sampler.py:208-323`` (`Sampler.forward`): a greedy batch (``is_all_greedy``: every
  request's ``top_k <= 1``, which ``SamplingParams`` makes of temperature 0) takes
  ``log_softmax(logits)``; otherwise ``logits.div_(temperatures)``, the sampler's softmax
  (``sglang.kernels.ops.sampling.softmax``) and ``logprobs = torch.log(probs)``, so a token whose
  probability underflowed to 0 has ``-inf`` here;
- ``layers/logprob_processor.py:918-944`` (`OutputLogprobProcessor.compute_logprobs`, SGLang's
  own code, called here): clamps to ``finfo(float32).min`` (so ``-inf`` leaves as
  ``-3.4028234663852886e38``, never as ``null``), the top-K by ``torch.topk`` and the sampled
  token's entry;
- ``managers/scheduler_components/batch_result_processor.py:536-559`` (`move_logprobs_to_cpu`):
  ``.tolist()`` of the float32 tensors (Python floats holding float32 values);
- ``managers/scheduler_components/logprob_result_processor.py:319-361``
  (`add_logprob_return_values`): per step, the sampled token's value and id, and with
  ``top_logprobs_num > 0`` its top-K row (ids and values).
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from typing import Any

import torch

# A logit this far under a row's top underflows to probability 0 in float32 softmax
# (exp(-150) < the smallest subnormal): the sampling path's log gives -inf for it.
_FAR = 150.0


@dataclass
class OutputLogprobs:
    """Per output token what `Req.logprob` holds (schedule_batch.py:939-942)."""

    token_val: list[float]  # output_token_logprobs_val
    token_idx: list[int]  # output_token_logprobs_idx: the sampled ids
    top_val: list[list[float]]  # output_top_logprobs_val ([] unless top_logprobs_num > 0)
    top_idx: list[list[int]]


def output_logprobs(
    input_ids: list[int], output_ids: list[int], sp: Any, top_k: int, vocab_size: int
) -> OutputLogprobs:
    """The scheduler's logprob values for ``output_ids`` (``sp``: the request's normalised
    `SamplingParams`; ``top_k``: its ``top_logprobs_num``)."""
    from sglang.srt.layers.logprob_processor import OutputLogprobProcessor

    out = OutputLogprobs([], [], [], [])
    if not output_ids:
        return out
    greedy = sp.top_k <= 1  # sampling_batch_info: is_all_greedy for a batch of one
    logits = _logits(input_ids, output_ids, vocab_size, greedy)
    if greedy:
        logprobs = torch.nn.functional.log_softmax(logits, dim=-1)
    else:
        logits.div_(torch.tensor([[sp.temperature]], dtype=torch.float32))
        logprobs = torch.log(_softmax(logits))
    n = len(output_ids)
    result = OutputLogprobProcessor().compute_logprobs(
        logprobs, [top_k] * n, [None] * n, torch.tensor(output_ids, dtype=torch.int64)
    )
    out.token_val = result.token_logprobs.tolist()
    out.token_idx = list(output_ids)
    if top_k > 0:
        out.top_val = [v.tolist() for v in result.top_logprobs_val]
        out.top_idx = [i.tolist() for i in result.top_logprobs_idx]
    return out


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    """The sampler's softmax (layers/sampler.py:297), torch's where SGLang's kernel module is
    not importable on this CPU box (it falls back to torch.softmax on CPU anyway)."""
    try:
        from sglang.kernels.ops.sampling import softmax
    except ImportError:
        return torch.softmax(logits, dim=-1)
    result: torch.Tensor = softmax(logits)
    return result


def _logits(
    input_ids: list[int], output_ids: list[int], vocab_size: int, greedy: bool
) -> torch.Tensor:
    """One made-up float32 logits row per output token, its token placed where a sampler could
    have drawn it: the row's top when greedy, else mostly the top, sometimes lower (now and
    then rank 4, past a small top-K). One row in
    four is peaked: a few tokens hold all the mass and the rest sits ``_FAR`` below."""
    seed = hashlib.sha256(array("q", input_ids).tobytes()).digest()
    gen = torch.Generator().manual_seed(int.from_bytes(seed[:8], "little") >> 1)
    n = len(output_ids)
    rows = torch.randn((n, vocab_size), generator=gen, dtype=torch.float32) * 2.0
    draws = torch.rand((n, 2), generator=gen).tolist()
    for pos, (token, (shape, rank_draw)) in enumerate(zip(output_ids, draws, strict=True)):
        row = rows[pos]
        if shape < 0.25:  # peaked: 1..3 tokens keep the mass
            keep = 1 + int(shape * 12)
            order = torch.argsort(row, descending=True)
            row[order[keep:]] -= _FAR
        order = torch.argsort(row, descending=True)
        rank = 0 if greedy or rank_draw < 0.7 else (1 if rank_draw < 0.85 else 2)
        if not greedy and rank_draw >= 0.95:
            rank = 4  # past a small top-K
        live = int((row > row.max() - _FAR / 2).sum())
        rank = min(rank, live - 1)  # never a token of probability 0
        there = int(order[rank])
        row[token], row[there] = row[there].item(), row[token].item()
    return rows
