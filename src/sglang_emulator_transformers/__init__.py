"""The emulator's transformers backend: a real causal LM behind ``/generate``
(``--emu-model-backend transformers``, the checkpoint at ``--model-path``), optionally
speculating with an EAGLE-3 draft (``--speculative-algorithm EAGLE3
--speculative-draft-model-path DIR``).

Why: the CPU lab (trainers/lab.sh) runs the whole loop with real models, so a measured accept
length means something. Output ids are the model's own: greedy when SGLang would be (top_k 1),
else sampled from temperature/top-k/top-p with the request's seed. Speculation is chain
verification (topk 1) by the lossless pure functions of ``sglang_emulator.speculation`` on
torch-computed distributions; the per-request counters go back in ``Generation.counters``.

A package of its own, outside the runtime wheel: it imports torch (and, for a draft,
speculators), which are not the project's dependencies; the emulator imports it only when the
flag is given (``sglang_emulator.backend.load_backend``). The requests in flight are served
together: without a draft as one padded batch (left padding, one KV cache, finished rows
dropped from it); with a draft one sequence after another within the batch (each its own
cache, cropped to the accepted tokens).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from sglang_emulator.args import EmulatorArgs
from sglang_emulator.backend import BackendError, Generation
from sglang_emulator.logprobs import Scored
from sglang_emulator.protocol import Item
from sglang_emulator.sampling import Sampling
from sglang_emulator.speculating import SpecSettings
from sglang_emulator.speculation import (
    SpecCounters,
    VerifyTally,
    sample,
    verify_greedy,
    verify_sampling,
)
from sglang_emulator.vocab import Vocab

# The batch a server without --max-running-requests serves at once (CPU: past about 8 rows a
# step costs as much more as it serves).
DEFAULT_MAX_BATCH = 8


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


def draft_to_target(model: Any) -> torch.Tensor:
    """Target id of each draft-vocabulary id: speculators' ``d2t`` offsets (draft id ``i`` is
    target id ``i + d2t[i]``), or the ids themselves for a draft with the target's vocabulary."""
    d2t = getattr(model, "d2t", None)
    base = torch.arange(model.lm_head.weight.shape[0])
    return base + d2t if d2t is not None and d2t.any() else base


class Eagle3Chain:
    """An EAGLE-3 draft from speculators' own model class, run as a chain: step 0 over every
    position (features of token i with the embedding of token i + 1, as speculators trains
    it), then one position per further draft token, attending to everything before it."""

    def __init__(
        self, path: Path, target: TransformersTarget, rejection_sampling: bool = False
    ) -> None:
        from speculators.models.eagle3 import Eagle3DraftModel

        self.rejection_sampling = rejection_sampling
        self._memo: tuple[list[int], int, Any] | None = None  # (ids, positions, step-0 cache)
        self.model = Eagle3DraftModel.from_pretrained(str(path), dtype=torch.float32).eval()
        # Step 0's keys are kept between verify steps only where the draft's attention takes a
        # plain causal mask over the cached and new positions (sdpa, eager); speculators' flex
        # attention wants a BlockMask, so such a draft runs step 0 whole, as without the memo.
        layer_config = getattr(self.model.config, "transformer_layer_config", None)
        impl = getattr(layer_config, "_attn_implementation", None)
        self._keeps_step0 = impl in ("sdpa", "eager")
        self.to_target = draft_to_target(self.model)
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
        self,
        hidden: torch.Tensor,
        ids: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the draft's layers (``Eagle3DraftModel.forward``'s loop body)."""
        m = self.model
        h = torch.cat([m.embed_tokens(ids), hidden], dim=-1)
        emb = m.rotary_emb(h, positions)
        for layer in m.layers:
            h = layer(
                h,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                position_embeddings=emb,
            )
        last = h[:, -1:]  # only the last position proposes: the head is vocab-wide
        logits = m.lm_head(m.norm(last)) if not m.config.norm_output else m.lm_head(last)
        return h, logits

    def propose(
        self, ids: list[int], aux: torch.Tensor, k: int, s: Sampling, rng: random.Random
    ) -> tuple[list[int], list[list[float]]]:
        """``k`` draft tokens after ``ids`` and the target-vocabulary distributions they came
        from (one-hot when greedy). ``aux`` holds the target's features of ``ids[:-1]``."""
        from transformers import DynamicCache

        m = self.model
        n = aux.shape[0]
        # Step 0 of an accepted position never changes (its target features and next token are
        # fixed), so its keys stay in the draft's cache from the previous verify step of the
        # same sequence; only the new positions run (the chain's own entries are cropped).
        start, cache = 0, None
        if self._memo is not None and self._keeps_step0:
            old_ids, old_n, old_cache = self._memo
            if n > 0 and old_n <= n and ids[: old_n + 1] == old_ids:
                # at least the last position runs again: it is the one that proposes (a new
                # request repeating the previous one's prompt has no new position at all)
                start, cache = min(old_n, n - 1), old_cache
                cache.crop(start)
        if cache is None:
            cache = DynamicCache()
        with torch.no_grad():
            hidden = m.fc(self._features(aux[start:].unsqueeze(0)))
            tokens = torch.tensor([ids[start + 1 : n + 1]], dtype=torch.long)
            positions = torch.arange(start + 1, n + 1).unsqueeze(0)
            mask = None
            if start > 0 and n - start > 1:  # causal over the cached and the new positions
                q = torch.arange(start, n).unsqueeze(1)
                mask = (torch.arange(n).unsqueeze(0) <= q)[None, None]
            h, logits = self._step(hidden, tokens, positions, cache, mask)
            self._memo = (list(ids[: n + 1]), n, cache)
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


def generate_batch(
    target: TransformersTarget,
    prompts: list[list[int]],
    samplings: list[Sampling],
    seeds: list[int],
    limits: list[int],
    stops: list[frozenset[int]],
    scorers: list[Scorer | None],
) -> list[list[int]]:
    """Plain generation of several prompts at once: left-padded, one KV cache, each row with
    its own sampling and seed; a finished row leaves the cache. Each output goes through its
    stop id (kept) or its limit."""
    from transformers import DynamicCache

    rngs = [random.Random(seed) for seed in seeds]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    outs: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))  # the original index of each row still in the cache
    with torch.no_grad():
        logits = target.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        next_pos = mask.sum(-1)
        while True:
            keep: list[int] = []
            for row, b in enumerate(live):
                s = samplings[b]
                token = ModelGenerator._pick(logits[row], s, rngs[b])
                outs[b].append(token)
                scorer = scorers[b]
                if scorer is not None:
                    scorer.add(logits[row : row + 1], [token])
                if not _done(outs[b], limits[b], stops[b], s.min_new_tokens):
                    keep.append(row)
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep)
                cache.batch_select_indices(index)
                mask, next_pos = mask[index], next_pos[index]
                live = [live[row] for row in keep]
            feed = torch.tensor([[outs[b][-1]] for b in live])
            mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype)], dim=-1)
            logits = target.model(
                input_ids=feed,
                attention_mask=mask,
                position_ids=next_pos.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]
            next_pos = next_pos + 1
    return outs


class TransformersBackend:
    """The emulator's ``Backend`` for a transformers causal LM (and an EAGLE-3 draft)."""

    def __init__(
        self, target: TransformersTarget, draft: Drafter | None, steps: int, max_batch: int
    ) -> None:
        self.target = target
        self.generator = ModelGenerator(target, draft, steps)
        self.max_batch = max_batch
        self.eos_ids: frozenset[int] = frozenset()

    def generate(self, items: list[Item]) -> list[Generation]:
        scorers = [
            Scorer(i.sampling, i.top_logprobs) if i.top_logprobs is not None else None
            for i in items
        ]
        stops = [
            frozenset() if i.sampling.ignore_eos else i.sampling.stop_token_ids | self.eos_ids
            for i in items
        ]
        seeds = [0 if i.sampling.greedy else i.seed for i in items]
        if self.generator.draft is None:
            outs = generate_batch(
                self.target,
                [i.input_ids for i in items],
                [i.sampling for i in items],
                seeds,
                [i.max_new for i in items],
                stops,
                scorers,
            )
            return [
                Generation(
                    _through_stop(o, i.max_new, st, i.sampling.min_new_tokens), None, _rows(sc, o)
                )
                for o, i, st, sc in zip(outs, items, stops, scorers, strict=True)
            ]
        answers = []
        for item, seed, st, scorer in zip(items, seeds, stops, scorers, strict=True):
            ids, counters = self.generator.generate(
                item.input_ids, item.sampling, seed, item.max_new, st, scorer
            )
            answers.append(Generation(ids, counters, scorer.rows if scorer else None))
        return answers


def _rows(scorer: Scorer | None, out: list[int]) -> list[Scored] | None:
    return None if scorer is None else scorer.rows[: len(out)]


def _check_speculation(ns: Any, settings: SpecSettings) -> None:
    """What this backend's verifier serves: EAGLE3 chains (topk 1), lossless thresholds."""
    if settings.algorithm != "EAGLE3":
        raise BackendError(
            f"--speculative-algorithm {settings.algorithm}: the transformers backend runs EAGLE3"
        )
    if settings.eagle_topk != 1:
        raise BackendError(
            f"--speculative-eagle-topk {settings.eagle_topk}: the transformers backend "
            "verifies chains (topk 1)"
        )
    for flag in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        value = getattr(ns, flag, None)
        if value is not None and float(value) != 1.0:
            raise BackendError(
                f"--{flag.replace('_', '-')} {value}: the transformers backend verifies "
                "losslessly only"
            )


def _aux_layers(draft_path: Path | None, default: tuple[int, ...]) -> tuple[int, ...]:
    """The target layers whose outputs the draft reads: its config's, if it names them (the
    hidden-states index ``i`` of transformers' output is the input of layer ``i``)."""
    if draft_path is None:
        return default
    import json

    config = json.loads((draft_path / "config.json").read_text())
    layers = config.get("eagle_aux_hidden_state_layer_ids") or config.get("target_layer_ids")
    return tuple(int(x) for x in layers) if layers else default


def load(args: EmulatorArgs, settings: SpecSettings | None, vocab: Vocab) -> TransformersBackend:
    """The backend for ``--model-path`` (and the draft of ``settings``), or a BackendError."""
    try:
        draft_path = None
        if settings is not None:
            _check_speculation(args.ns, settings)
            draft_path = Path(settings.draft_model_path).expanduser()
        torch.manual_seed(0)
        target = TransformersTarget(
            Path(args.model_path).expanduser(), _aux_layers(draft_path, (1, 2, 3))
        )
        reject = bool(getattr(args.ns, "speculative_use_rejection_sampling", False))
        draft = Eagle3Chain(draft_path, target, reject) if draft_path is not None else None
    except (ValueError, OSError) as e:  # a one-line reason, not a traceback
        raise BackendError(f"--emu-model-backend transformers: {e}") from None
    steps = settings.num_steps if settings is not None else 0
    batch = args.max_running_requests or DEFAULT_MAX_BATCH
    backend = TransformersBackend(target, draft, steps, batch)
    backend.eos_ids = frozenset(vocab.eos_ids)
    return backend
