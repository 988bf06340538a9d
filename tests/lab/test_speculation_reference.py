"""The speculating server against references it does not share code with: transformers' own
``generate`` at temperature 0 (the same ids), and the target's exact next-token distributions at
temperature 1 (the same output distribution, by total-variation distance over many seeded
draws). Real HTTP to the emulator as a process, a real tiny Llama and an untrained EAGLE-3 draft
(speculators' own class). Needs the trainer venv (tests/lab/test_model_backend.py has the command).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("speculators")

from tests.lab.test_model_backend_http import (  # noqa: E402  (after the skips)
    PROMPT,
    SPEC,
    _generate,
    _start,
    _stop,
    models,  # noqa: F401  (the module's fixture)
)

DRAWS = 300
TEMPERATURE = 0.2
DELTA = 1e-4  # the chance that a correct sampler still fails the bound


def test_speculating_server_returns_what_transformers_generate_returns(
    models: tuple[Path, Path],  # noqa: F811
) -> None:
    target, draft = models
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    # SGLang's stop ids: the configs' eos ids and the tokenizer's eos token
    tok = transformers.AutoTokenizer.from_pretrained(target, trust_remote_code=True)
    eos = sorted({model.config.eos_token_id, tok.eos_token_id})
    prompts = [PROMPT, PROMPT[:7], [*PROMPT[3:], 42, 72]]
    with torch.no_grad():
        want = []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=40,
                eos_token_id=eos,
                pad_token_id=eos[0],
            )
            want.append(out[0, len(prompt) :].tolist())
    spec, url = _start(target, *SPEC, "--speculative-draft-model-path", str(draft))
    try:
        got = [
            _generate(
                url,
                {"input_ids": p, "sampling_params": {"temperature": 0, "max_new_tokens": 40}},
            )
            for p in prompts
        ]
    finally:
        _stop(spec)
    assert [g["output_ids"] for g in got] == want
    assert all(g["meta_info"]["spec_verify_ct"] > 0 for g in got)


def _exact_second_token(target: Path) -> dict[int, float]:
    """P(second output token = t) under the target alone at TEMPERATURE: the sum over every
    first token f of p(f) * p(t | f), from full forward passes (no cache)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    with torch.no_grad():
        first = torch.softmax(
            model(torch.tensor([PROMPT])).logits[0, -1].double() / TEMPERATURE, -1
        )
        vocab = first.shape[0]
        batch = torch.cat(
            [torch.tensor([PROMPT]).repeat(vocab, 1), torch.arange(vocab).unsqueeze(1)], dim=1
        )
        second = torch.cat(
            [model(chunk).logits[:, -1] for chunk in batch.split(128)], dim=0
        ).double()
        joint = first.unsqueeze(1) * torch.softmax(second / TEMPERATURE, -1)
    marginal = joint.sum(0)
    return {t: float(p) for t, p in enumerate(marginal.tolist()) if p > 0}


@pytest.fixture(scope="module")
def fixed_draft(
    models: tuple[Path, Path],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A draft that proposes one token, the target's likeliest second token, at every position
    (all its logits 0, and its vocabulary map sends draft id 0 there and every other id to the
    last id): so the sampling test's verify steps accept often and reject often."""
    from speculators.models.eagle3 import Eagle3DraftModel

    target, _ = models
    exact = _exact_second_token(target)
    favourite = max(exact, key=exact.__getitem__)
    config = transformers.AutoConfig.from_pretrained(target)
    config._attn_implementation = "sdpa"
    vocab = config.vocab_size - 1  # a draft vocabulary of its own: it has a map to the target's
    d2t = vocab - torch.arange(vocab)  # draft id i -> target id i + d2t[i] = the last id
    d2t[0] = favourite
    t2d = torch.ones(config.vocab_size, dtype=torch.bool)
    t2d[-1] = False  # which target rows the draft's lm_head starts from (zeroed below)
    model = Eagle3DraftModel.from_training_args(
        config,
        verifier_name_or_path=str(target),
        draft_vocab_size=vocab,
        norm_before_residual=True,
        ttt_steps=3,
        target_layer_ids=[1, 2, 3],
        draft_attn_impl="sdpa",
        t2d=t2d,
        d2t=d2t,
    )
    assert favourite < vocab
    with torch.no_grad():
        model.lm_head.weight.zero_()
    out = tmp_path_factory.mktemp("fixed-draft")
    model.save_pretrained(out)
    return out


def tv_bound(probs: dict[int, float], draws: int, delta: float = DELTA) -> float:
    """What the empirical distribution of ``draws`` exact draws stays within, in total
    variation, with probability 1 - ``delta``: E[TV] <= 1/2 sum sqrt(p (1 - p) / n) (each
    count's standard deviation), and TV moves by at most 1/n per draw, so by McDiarmid's
    inequality it exceeds its mean by t with probability at most exp(-2 n t^2)."""
    mean = 0.5 * sum(math.sqrt(p * (1 - p) / draws) for p in probs.values())
    return mean + math.sqrt(math.log(1 / delta) / (2 * draws))


def test_sampling_with_speculation_is_distributed_as_the_target(
    models: tuple[Path, Path],  # noqa: F811
    fixed_draft: Path,
) -> None:
    """``DRAWS`` requests at TEMPERATURE with seeds 0..DRAWS-1: the second output token is the
    first one a verify step makes (the first comes from the prefill), through the torch path
    (``distribution`` of the target's logits, the draft's proposal, ``verify_sampling``).

    The target's second token is about 0.69 its favourite and 0.27 one other; the draft always
    proposes the favourite. A verifier that accepted every draft would be 0.31 away in TV, one
    that resampled from the target instead of the residual after a rejection about 0.2: both
    above the bound (0.18 for 300 draws)."""
    target, _ = models
    draft = fixed_draft
    exact = _exact_second_token(target)
    spec, url = _start(target, *SPEC, "--speculative-draft-model-path", str(draft))
    seen: Counter[int] = Counter()
    accepted = 0
    try:
        for seed in range(DRAWS):
            body = {
                "input_ids": PROMPT,
                "sampling_params": {
                    "temperature": TEMPERATURE,
                    "max_new_tokens": 2,
                    "sampling_seed": seed,
                },
            }
            res = _generate(url, body)
            seen[res["output_ids"][1]] += 1
            accepted += res["meta_info"]["spec_num_correct_drafts"]
    finally:
        _stop(spec)
    tokens = set(exact) | set(seen)
    tv = 0.5 * sum(abs(seen[t] / DRAWS - exact.get(t, 0.0)) for t in tokens)
    bound = tv_bound(exact, DRAWS)
    assert tv <= bound, f"TV {tv:.4f} > {bound:.4f} ({DRAWS} draws, {accepted} drafts accepted)"
    assert accepted > DRAWS / 2  # the accept branch ran, not only the residual one
