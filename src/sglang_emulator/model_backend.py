"""A real model behind ``/generate``: a transformers causal LM (``--emu-model-backend
transformers``, the checkpoint at ``--model-path``), optionally speculating with an EAGLE-3 draft
(``--speculative-algorithm EAGLE3 --speculative-draft-model-path DIR``).

Why: the CPU lab (trainers/lab.sh) runs the whole loop with real models, so a measured accept
length means something. Output ids are the model's own: greedy when SGLang would be (top_k 1),
else sampled from temperature/top-k/top-p with the request's seed. Speculation is chain
verification (topk 1) by the lossless pure functions of ``speculation.py`` on torch-computed
distributions; the per-request counters become SGLang's ``meta_info`` spec fields.

torch (and, for a draft, speculators) are imported only here, and this module only when the
flag is given: the emulator's other modes never need them. Generation runs in the event loop,
so requests are served one at a time (the lab's runs use a concurrency of 2).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from sglang_emulator import info
from sglang_emulator.args import EmulatorArgs
from sglang_emulator.logprobs import real_logprobs, with_logprob_fields
from sglang_emulator.protocol import ABORTED, Item, Result, run_item, truncate
from sglang_emulator.sampling import Sampling
from sglang_emulator.server import Emulator, _json, log
from sglang_emulator.speculation import (
    ServerAcceptance,
    SpecCounters,
    VerifyTally,
    sample,
    verify_greedy,
    verify_sampling,
)
from sglang_emulator.vocab import Vocab


def distribution(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Next-token probabilities under the request's temperature, top-k and top-p."""
    logits = logits.double() / max(s.temperature, 1e-6)
    if 0 < s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cut = torch.cumsum(sorted_p, 0) - sorted_p >= s.top_p
        sorted_p[cut] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        probs = probs / probs.sum()
    return probs


@dataclass
class _State:
    """The target's KV cache covers ``ids[:-1]``; ``aux`` holds its EAGLE-3 features for the
    same positions (the inputs of the draft's target layers)."""

    ids: list[int]
    cache: Any
    aux: list[torch.Tensor]


class TransformersTarget:
    """The target model: prefill and cached forward passes that also return EAGLE-3 features."""

    def __init__(self, path: Path, aux_layers: tuple[int, ...] = (1, 2, 3)) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.aux_layers = aux_layers

    def forward(self, state: _State, new: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [len(new), vocab] and aux features [len(new), 3 * hidden] of ``new``."""
        with torch.no_grad():
            out = self.model(
                input_ids=torch.tensor([new]),
                past_key_values=state.cache,
                use_cache=True,
                output_hidden_states=True,
            )
        state.cache = out.past_key_values
        aux = torch.cat([out.hidden_states[i][0] for i in self.aux_layers], dim=-1)
        return out.logits[0], aux

    def prefill(self, prompt: list[int]) -> tuple[_State, torch.Tensor]:
        state = _State(list(prompt), None, [])
        logits, aux = self.forward(state, list(prompt))
        state.aux.append(aux)
        return state, logits[-1]


class Drafter(Protocol):
    """What the verifier needs from a draft: ``k`` tokens after ``ids`` and the distributions
    they came from (``aux``: the target's EAGLE-3 features of ``ids[:-1]``)."""

    def propose(
        self, ids: list[int], aux: torch.Tensor, k: int, s: Sampling, rng: random.Random
    ) -> tuple[list[int], list[list[float]]]: ...


class Eagle3Chain:
    """An EAGLE-3 draft from speculators' own model class, run as a chain: step 0 over every
    position (features of token i with the embedding of token i + 1, as speculators trains
    it), then one position per further draft token, attending to everything before it."""

    def __init__(
        self, path: Path, target: TransformersTarget, rejection_sampling: bool = False
    ) -> None:
        from speculators.models.eagle3 import Eagle3DraftModel

        self.rejection_sampling = rejection_sampling
        self.model = Eagle3DraftModel.from_pretrained(str(path), dtype=torch.float32).eval()
        d2t = getattr(self.model, "d2t", None)
        n = self.model.lm_head.weight.shape[0]
        base = torch.arange(n)
        self.to_target = base + d2t if d2t is not None and d2t.any() else base
        config = target.model.config
        self.vocab_size = int(config.vocab_size)
        features = len(target.aux_layers) * int(config.hidden_size)
        if self.model.fc.in_features != features or int(self.to_target.max()) >= self.vocab_size:
            raise ValueError(
                f"draft {path} does not fit the target: it reads {self.model.fc.in_features} "
                f"features and proposes ids up to {int(self.to_target.max())}; the target gives "
                f"{features} features and has {self.vocab_size} ids"
            )

    def _features(self, aux: torch.Tensor) -> torch.Tensor:
        """The norms speculators applies before ``fc`` (``Eagle3DraftModel.forward``)."""
        m = self.model
        if m.input_norm is not None:
            aux = m.input_norm(aux)
        if m.fc_norm is not None:
            chunks = aux.chunk(len(m.fc_norm), dim=-1)
            aux = torch.cat([norm(c) for norm, c in zip(m.fc_norm, chunks, strict=True)], dim=-1)
        return aux

    def _step(
        self, hidden: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the draft's layers (``Eagle3DraftModel.forward``'s loop body)."""
        m = self.model
        h = torch.cat([m.embed_tokens(ids), hidden], dim=-1)
        emb = m.rotary_emb(h, positions)
        for layer in m.layers:
            h = layer(
                h,
                attention_mask=None,
                position_ids=positions,
                past_key_values=cache,
                position_embeddings=emb,
            )
        logits = m.lm_head(m.norm(h)) if not m.config.norm_output else m.lm_head(h)
        return h, logits

    def propose(
        self, ids: list[int], aux: torch.Tensor, k: int, s: Sampling, rng: random.Random
    ) -> tuple[list[int], list[list[float]]]:
        """``k`` draft tokens after ``ids`` and the target-vocabulary distributions they came
        from (one-hot when greedy). ``aux`` holds the target's features of ``ids[:-1]``."""
        from transformers import DynamicCache

        m = self.model
        n = aux.shape[0]
        with torch.no_grad():
            hidden = m.fc(self._features(aux.unsqueeze(0)))
            tokens = torch.tensor([ids[1:]])
            positions = torch.arange(1, n + 1).unsqueeze(0)
            cache = DynamicCache()
            h, logits = self._step(hidden, tokens, positions, cache)
            drafts: list[int] = []
            dists: list[list[float]] = []
            for j in range(k):
                token, dist = self._pick(logits[0, -1], s, rng)
                drafts.append(token)
                dists.append(dist)
                if j + 1 < k:
                    pos = torch.tensor([[n + j + 1]])
                    h, logits = self._step(h[:, -1:], torch.tensor([[token]]), pos, cache)
        return drafts, dists

    def _pick(
        self, logits: torch.Tensor, s: Sampling, rng: random.Random
    ) -> tuple[int, list[float]]:
        """SGLang's default: the draft's argmax, verified as if drawn one-hot (lossless);
        with ``--speculative-use-rejection-sampling`` a draw from the draft's distribution."""
        full = torch.full((self.vocab_size,), float("-inf"), dtype=logits.dtype)
        full[self.to_target] = logits
        if s.greedy or not self.rejection_sampling:
            token = int(torch.argmax(full))
            return token, [1.0 if i == token else 0.0 for i in range(full.shape[0])]
        probs = distribution(full, s).tolist()
        return sample(probs, rng), probs


Scored = tuple[float, list[tuple[float, int]]]  # (the token's logprob, top-K (logprob, id))


class Scorer:
    """SGLang's logprobs of each output token (``layers/sampler.py``, docs/sglang-api.md §2a):
    ``log_softmax(logits)`` when greedy, else ``log(softmax(logits / temperature))``, before
    top-k/top-p truncation, in float32, clamped to float32's lowest value (a probability that
    underflowed: ``layers/logprob_processor.py:926``); the top-K of that same row, highest
    first."""

    def __init__(self, s: Sampling, top_k: int) -> None:
        self.greedy = s.greedy
        self.temperature = 1.0 if s.greedy else max(s.temperature, 1e-6)
        self.top_k = top_k
        self.rows: list[Scored] = []

    def add(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Score ``tokens``, each drawn from the matching row of ``logits``."""
        rows = logits[: len(tokens)].float() / self.temperature
        if self.greedy:
            lp = torch.log_softmax(rows, dim=-1)
        else:
            lp = torch.log(torch.softmax(rows, dim=-1))
        lp = lp.clamp(min=torch.finfo(lp.dtype).min)
        k = min(self.top_k, lp.shape[-1])
        values, ids = torch.topk(lp, k, dim=-1) if k > 0 else (lp[:, :0], lp[:, :0].long())
        for i, token in enumerate(tokens):
            top = list(zip(values[i].tolist(), ids[i].tolist(), strict=True))
            self.rows.append((float(lp[i, token]), top))


class ModelGenerator:
    """Generation with the target alone, or speculative with a draft chain of ``steps``."""

    def __init__(self, target: TransformersTarget, draft: Drafter | None, steps: int) -> None:
        self.target = target
        self.draft = draft
        self.steps = steps

    def generate(
        self,
        prompt: list[int],
        s: Sampling,
        seed: int,
        limit: int,
        stops: frozenset[int],
        scorer: Scorer | None = None,
    ) -> tuple[list[int], SpecCounters | None]:
        """Output ids and speculation counters; ``scorer`` (if given) gets the target's
        logits at every output position (with a draft: those the verifier kept)."""
        rng = random.Random(seed)
        state, logits = self.target.prefill(prompt)
        out = [self._pick(logits, s, rng)]
        state.ids.append(out[0])
        if scorer is not None:
            scorer.add(logits.unsqueeze(0), out)
        tally = VerifyTally() if self.draft is not None else None
        while not _done(out, limit, stops, s.min_new_tokens):
            if tally is None:
                logits, aux = self.target.forward(state, [state.ids[-1]])
                state.aux.append(aux)
                token = self._pick(logits[-1], s, rng)
                out.append(token)
                state.ids.append(token)
                if scorer is not None:
                    scorer.add(logits[-1:], [token])
            else:
                made = self._verify_step(state, s, rng, scorer)
                tally.step(len(made) - 1)
                out += made
        out = _through_stop(out, limit, stops, s.min_new_tokens)
        if scorer is not None:  # a verify step can go past the limit or a stop
            del scorer.rows[len(out) :]
        return out, (tally.counters(len(out)) if tally is not None else None)

    def _verify_step(
        self, state: _State, s: Sampling, rng: random.Random, scorer: Scorer | None = None
    ) -> list[int]:
        assert self.draft is not None
        kept = len(state.ids) - 1  # the cache's length before this step
        aux = torch.cat(state.aux, dim=0)
        drafts, q = self.draft.propose(state.ids, aux, self.steps, s, rng)
        logits, new_aux = self.target.forward(state, [state.ids[-1], *drafts])
        if s.greedy:
            verified = verify_greedy(logits.tolist(), drafts)
        else:
            p = [distribution(row, s).tolist() for row in logits]
            verified = verify_sampling(p, q, drafts, rng)
        accepted = verified.num_correct_drafts
        state.cache.crop(kept + 1 + accepted)
        state.aux.append(new_aux[: accepted + 1])
        state.ids += verified.tokens
        if scorer is not None:  # row j is the target's distribution after draft j - 1
            scorer.add(logits, list(verified.tokens))
        return list(verified.tokens)

    @staticmethod
    def _pick(logits: torch.Tensor, s: Sampling, rng: random.Random) -> int:
        if s.greedy:
            return int(torch.argmax(logits))
        return sample(distribution(logits, s).tolist(), rng)


def _done(out: list[int], limit: int, stops: frozenset[int], min_new: int) -> bool:
    return len(out) >= limit or any(t in stops for t in out[min_new:])


def _through_stop(out: list[int], limit: int, stops: frozenset[int], min_new: int) -> list[int]:
    for i in range(min_new, len(out)):
        if out[i] in stops:
            return out[: min(i + 1, limit)]
    return out[:limit]


def _spec_settings(args: EmulatorArgs) -> tuple[Path | None, int, int]:
    """(draft directory, draft steps, num_draft_tokens) from SGLang's own flags."""
    ns = args.ns
    algorithm = getattr(ns, "speculative_algorithm", None)
    if not algorithm:
        return None, 0, 0
    if str(algorithm).upper() != "EAGLE3":
        raise ValueError(f"--speculative-algorithm {algorithm}: the model backend runs EAGLE3")
    path = getattr(ns, "speculative_draft_model_path", None)
    if not path or not Path(path).is_dir():
        raise ValueError(f"--speculative-draft-model-path {path!r} is not a directory")
    topk = int(getattr(ns, "speculative_eagle_topk", None) or 1)
    if topk != 1:
        raise ValueError(f"--speculative-eagle-topk {topk}: the model backend verifies chains")
    for flag in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        value = getattr(ns, flag, None)
        if value is not None and float(value) != 1.0:
            raise ValueError(
                f"--{flag.replace('_', '-')} {value}: the model backend verifies losslessly only"
            )
    steps = int(getattr(ns, "speculative_num_steps", None) or 3)
    num_draft = int(getattr(ns, "speculative_num_draft_tokens", None) or steps + 1)
    if num_draft != steps + 1:
        raise ValueError("with topk 1, --speculative-num-draft-tokens must be num-steps + 1")
    return Path(path), steps, num_draft


def _spec_info(args: EmulatorArgs, steps: int, num_draft_tokens: int) -> dict[str, Any]:
    """The flat ``speculative_*`` fields of SGLang's ``/server_info`` (resolved values)."""
    ns = args.ns
    algorithm = getattr(ns, "speculative_algorithm", None)
    return {
        "speculative_algorithm": str(algorithm).upper() if algorithm else None,
        "speculative_draft_model_path": getattr(ns, "speculative_draft_model_path", None),
        "speculative_num_steps": steps or None,
        "speculative_eagle_topk": 1 if algorithm else None,
        "speculative_num_draft_tokens": num_draft_tokens or None,
        "speculative_accept_threshold_single": 1.0,
        "speculative_accept_threshold_acc": 1.0,
        "speculative_use_rejection_sampling": bool(
            getattr(ns, "speculative_use_rejection_sampling", False)
        ),
    }


class _Shim:
    """Hands precomputed ids to ``run_item``, which applies SGLang's stop rules and text."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    def generate(self, *_args: Any, **_kwargs: Any) -> list[int]:
        return self.ids


class ModelEmulator(Emulator):
    """The emulator with ``/generate`` answered by a real model (and draft, if speculating)."""

    def __init__(self, args: EmulatorArgs, vocab: Vocab) -> None:
        super().__init__(args, vocab)
        try:
            draft_path, steps, self.num_draft_tokens = _spec_settings(args)
            torch.manual_seed(0)
            target = TransformersTarget(Path(args.model_path).expanduser())
            reject = bool(getattr(args.ns, "speculative_use_rejection_sampling", False))
            draft = Eagle3Chain(draft_path, target, reject) if draft_path is not None else None
        except (ValueError, OSError) as e:  # a one-line reason, not a traceback
            log(f"ERROR: --emu-model-backend: {e}", err=True)
            raise SystemExit(1) from None
        self.spec_info = _spec_info(args, steps, self.num_draft_tokens)
        self.generator = ModelGenerator(target, draft, steps)
        self.acceptance = ServerAcceptance()
        self._spec: dict[str, SpecCounters] = {}
        self._scored: dict[str, list[Scored]] = {}

    def _run_now(self, item: Item, fault: Any) -> Result:
        s = item.sampling
        stops = frozenset() if s.ignore_eos else s.stop_token_ids | self.vocab.eos_ids
        scorer = Scorer(s, item.top_logprobs) if item.top_logprobs is not None else None
        ids, counters = self.generator.generate(
            item.input_ids, s, item.seed, item.max_new, stops, scorer
        )
        if scorer is not None:
            self._scored[item.rid] = scorer.rows
        if counters is not None:
            self._spec[item.rid] = counters
            self.acceptance.record(counters)
        result = run_item(item, _Shim(ids), self.vocab)  # type: ignore[arg-type]
        if fault == "abort":  # --emu-fault-abort-rate, as the fake model's path does
            keep = self.faults.abort_keep(item.digest, len(result.output_ids))
            result = truncate(result, keep, self.vocab, item.sampling, ABORTED)
        return result

    def _finish(
        self, item: Item, result: Result, t0: float, retractions: int = 0
    ) -> dict[str, Any]:
        response = super()._finish(item, result, t0, retractions)
        counters = self._spec.pop(item.rid, None)
        if counters is not None:
            response["meta_info"].update(counters.meta_info(self.num_draft_tokens))
        return response

    def _with_logprobs(
        self, meta: dict[str, Any], item: Item, output_ids: list[int]
    ) -> dict[str, Any]:
        """The target's own logprobs (not the fake model's) where SGLang puts them."""
        rows = self._scored.pop(item.rid, None)
        if rows is None:  # pragma: no cover - every item with top_logprobs was scored
            return super()._with_logprobs(meta, item, output_ids)
        text = (lambda t: self.vocab.decode([t], False)) if item.logprob_text else None
        fields = real_logprobs(output_ids, rows[: len(output_ids)], item.top_logprobs or 0, text)
        return with_logprob_fields(meta, fields)

    async def server_info(self, request: Any) -> Any:
        payload = info.server_info(self)
        for key, value in self.spec_info.items():
            payload.setdefault(key, value)
        average = self.acceptance.average()
        if average is not None:
            for state in payload.get("internal_states") or []:
                state["avg_spec_accept_length"] = average
        return _json(payload)
