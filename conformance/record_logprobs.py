"""The fixtures of a ``logprobs: {top_k: K}`` partition's requests (docs/logprobs.md), recorded by
`conformance/record.py` from the real app: the body our client sends (`client.generate_body`
with the partition's sampling and `logprobs.request_fields`) and SGLang's answer.

Cases: top_k 3 sampled (temperature 0.7) ended by the stop token, top_k 3 greedy (temperature
0) ended by max_new_tokens past one scheduler chunk (50 ids: the TokenizerManager joins the
chunks' logprobs), and top_k 0 (only the sampled token's logprob) ended by the stop token.
"""

from __future__ import annotations

import json
from typing import Any

from conformance.process import ASSETS, RealAppProcess

RUN = "rec0a1b2c3d-lp00"  # request_id's run part
# name -> (about, top_k, temperature, max_new_tokens, the finish it must record, the user's
# message: the fake model's output for it stops after 171, 176 and 16 ids).
CASES: dict[str, tuple[str, int, float, int, str, str]] = {
    "generate_logprobs_top3_stop": (
        "logprobs: {top_k: 3}, temperature 0.7: the request our client sends "
        "(return_logprob, logprob_start_len -1, top_logprobs_num 3); ended by the stop token "
        "after 171 ids (four scheduler chunks)",
        3,
        0.7,
        256,
        "stop",
        "Tell me fact number 13 about the ocean, with reasons.",
    ),
    "generate_logprobs_top3_greedy_length": (
        "logprobs: {top_k: 3}, temperature 0 (greedy: log_softmax of the logits); ended by "
        "max_new_tokens 70, past one 50-id scheduler chunk",
        3,
        0.0,
        70,
        "length",
        "Tell me fact number 2 about the ocean, with reasons.",
    ),
    "generate_logprobs_top0_stop": (
        "logprobs: {top_k: 0}: only output_token_logprobs (no top-K fields); temperature 0.7, "
        "ended by the stop token",
        0,
        0.7,
        256,
        "stop",
        "Explain in two sentences why the sky is blue.",
    ),
}


def logprob_request(
    name: str,
    top_k: int,
    temperature: float,
    max_new_tokens: int,
    text: str,
    headers: dict[str, str],
) -> dict[str, Any]:
    """One request as the pipeline builds it for a ``logprobs: {top_k: K}`` partition."""
    from eagle3_datagen.config import PipelineConfig
    from eagle3_datagen.inputs.prompts import Prompt
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
    from eagle3_datagen.render.token_ids import TokenIds
    from eagle3_datagen.sglang.client import generate_body, request_id

    config = PipelineConfig.model_validate(
        {
            "model": {"path": str(ASSETS / "kimi-k2.5-mini")},
            "sampling": {"temperature": temperature},
            "tiers": [{"name": "T", "concurrency": 4, "max_tokens": max_new_tokens}],
            "partitions": [
                {"name": "lp", "input": "in.jsonl", "tier": "T", "logprobs": {"top_k": top_k}}
            ],
            "output_dir": "out",
        }
    )
    partition = config.partitions[0]
    assert partition.logprobs is not None
    tokenizer = ChatTokenizer(config.model.path)
    ids = TokenIds.resolve(tokenizer, config.special_tokens)
    sampling = config.sampling.to_sglang(config.tiers[0].max_tokens, list(ids.stop_ids))
    [prompt_ids] = tokenizer.render([Prompt("q", 1, [{"role": "user", "content": text}], None)])
    assert isinstance(prompt_ids, list)
    rid = request_id(RUN, partition.name, name, 0)
    body = generate_body(prompt_ids, sampling, rid, None, partition.logprobs.top_k)
    return {"method": "POST", "path": "/generate", "headers": headers, "body": body}


def record_logprobs(rec: Any, app: RealAppProcess, headers: dict[str, str]) -> None:
    """The logprob cases, each checked to end as its name says."""
    for name, (about, top_k, temperature, max_new, finish, text) in CASES.items():
        request = logprob_request(name, top_k, temperature, max_new, text, headers)
        rec.http(app, name, about, request)
        answer = json.loads((rec.out / f"{name}.json").read_text())["response"]
        got = answer["body"]["meta_info"]["finish_reason"]["type"]
        assert got == finish, f"{name}: finished by {got}, not {finish}"
