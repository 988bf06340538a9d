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
together, with a draft or without, by one loop (``ModelGenerator.generate_many``): one padded
batch (left padding, one KV cache, finished rows dropped from it); a verify step feeds every
row its last token and its ``k`` drafts at once, and the drafts a row rejected are masked out
of the cache (the row's positions go on from its accepted ones), so rows accepting different
numbers of tokens share one forward pass.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, overload

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


class TransformersTarget:
    """The target model, and where its EAGLE-3 features come from."""

    def __init__(self, path: Path, aux_layers: tuple[int, ...] = (1, 2, 3)) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.aux_layers = aux_layers

    def features(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The EAGLE-3 features [batch, positions, layers * hidden] of a forward pass's hidden
        states (the inputs of ``aux_layers``)."""
        return torch.cat([hidden_states[i] for i in self.aux_layers], dim=-1)


class Drafter(Protocol):
    """What the verifier needs from a draft: ``k`` tokens after ``ids`` and the distributions
    they came from (``aux``: the target's EAGLE-3 features of ``ids[:-1]``). ``slot`` names the
    row of the batch, whose work the draft may keep between its verify steps."""

    def propose(
        self,
        ids: list[int],
        aux: torch.Tensor,
        k: int,
        s: Sampling,
        rng: random.Random,
        slot: int = 0,
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
        # per slot of the batch: (ids, positions, step-0 cache) of its last proposal
        self._memos: dict[int, tuple[list[int], int, Any]] = {}
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
        self,
        ids: list[int],
        aux: torch.Tensor,
        k: int,
        s: Sampling,
        rng: random.Random,
        slot: int = 0,
    ) -> tuple[list[int], list[list[float]]]:
        """``k`` draft tokens after ``ids`` and the target-vocabulary distributions they came
        from (one-hot when greedy). ``aux`` holds the target's features of ``ids[:-1]``."""
        from transformers import DynamicCache

        m = self.model
        n = aux.shape[0]
        # Step 0 of an accepted position never changes (its target features and next token are
        # fixed), so its keys stay in the draft's cache from the previous verify step of the
        # same sequence (the same slot); only the new positions run (the chain's own entries
        # are cropped). A slot now serving another sequence fails the prefix check: it starts over.
        start, cache = 0, None
        memo = self._memos.get(slot)
        if memo is not None and self._keeps_step0:
            old_ids, old_n, old_cache = memo
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
            self._memos[slot] = (list(ids[: n + 1]), n, cache)
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
            one_hot = [0.0] * full.shape[0]
            one_hot[token] = 1.0
            return token, one_hot
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


@dataclass
class _Row:
    """One request of a batch: prompt + output so far (``ids``), the target's features of
    ``ids[:-1]`` (with a draft), its own sampling, generator, limit and stops."""

    ids: list[int]
    s: Sampling
    rng: random.Random
    limit: int
    stops: frozenset[int]
    scorer: Scorer | None
    tally: VerifyTally | None
    out: list[int] = field(default_factory=list)
    aux: list[torch.Tensor] = field(default_factory=list)

    def done(self) -> bool:
        return _done(self.out, self.limit, self.stops, self.s.min_new_tokens)

    def commit(self, logits: torch.Tensor, tokens: list[int]) -> None:
        """Append ``tokens``; row ``j`` of ``logits`` is the distribution token ``j`` came from."""
        self.out += tokens
        self.ids += tokens
        if self.scorer is not None:
            self.scorer.add(logits, tokens)

    def result(self) -> tuple[list[int], SpecCounters | None]:
        """The output through its stop id (kept) or its limit: a verify step can go past both."""
        out = _through_stop(self.out, self.limit, self.stops, self.s.min_new_tokens)
        if self.scorer is not None:
            del self.scorer.rows[len(out) :]
        return out, (self.tally.counters(len(out)) if self.tally is not None else None)


class ModelGenerator:
    """Generation with the target alone, or speculative with a draft chain of ``steps``."""

    def __init__(self, target: TransformersTarget, draft: Drafter | None, steps: int) -> None:
        self.target = target
        self.draft = draft
        self.steps = steps if draft is not None else 0

    def generate(
        self,
        prompt: list[int],
        s: Sampling,
        seed: int,
        limit: int,
        stops: frozenset[int],
        scorer: Scorer | None = None,
    ) -> tuple[list[int], SpecCounters | None]:
        """One request: a batch of one."""
        return self.generate_many([prompt], [s], [seed], [limit], [stops], [scorer])[0]

    def generate_many(
        self,
        prompts: list[list[int]],
        samplings: list[Sampling],
        seeds: list[int],
        limits: list[int],
        stops: list[frozenset[int]],
        scorers: list[Scorer | None],
    ) -> list[tuple[list[int], SpecCounters | None]]:
        """Each prompt's output ids and speculation counters, served as one batch; each row
        draws from its own seed's generator in the order it would alone, so a row's output does
        not depend on its batch. ``scorers`` get the target's logits at every output position
        (with a draft: those the verifier kept)."""
        from transformers import DynamicCache

        speculating = self.draft is not None
        rows = [
            _Row(
                list(p),
                s,
                random.Random(seed),
                limit,
                st,
                sc,
                VerifyTally() if speculating else None,
            )
            for p, s, seed, limit, st, sc in zip(
                prompts, samplings, seeds, limits, stops, scorers, strict=True
            )
        ]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        cache = DynamicCache()
        with torch.no_grad():
            out = self.target.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=speculating,
            )
            aux = self.target.features(out.hidden_states) if speculating else None
            for b, row in enumerate(rows):
                if aux is not None:
                    row.aux.append(aux[b, width - len(prompts[b]) :])
                row.commit(out.logits[b, -1:], [_pick(out.logits[b, -1], row.s, row.rng)])
            next_pos = mask.sum(-1)  # the position of each row's last token, fed next
            live = list(range(len(rows)))  # the original index of each row still in the cache
            while True:
                keep = [r for r, b in enumerate(live) if not rows[b].done()]
                if not keep:
                    break
                if len(keep) < len(live):
                    index = torch.tensor(keep)
                    cache.batch_select_indices(index)
                    mask, next_pos = mask[index], next_pos[index]
                    live = [live[r] for r in keep]
                mask, next_pos = self._step(rows, live, cache, mask, next_pos)
        return [row.result() for row in rows]

    def _step(
        self,
        rows: list[_Row],
        live: list[int],
        cache: Any,
        mask: torch.Tensor,
        next_pos: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward pass over the live rows: each row's last token and its drafts; then
        each row commits what its verifier kept (without a draft: one sampled token)."""
        k = self.steps
        proposals = [
            self.draft.propose(
                rows[b].ids, torch.cat(rows[b].aux), k, rows[b].s, rows[b].rng, slot=b
            )
            if self.draft is not None
            else ([], [])
            for b in live
        ]
        feed = torch.tensor(
            [[rows[b].ids[-1], *drafts] for b, (drafts, _) in zip(live, proposals, strict=True)]
        )
        mask = torch.cat([mask, torch.ones(len(live), k + 1, dtype=mask.dtype)], dim=-1)
        out = self.target.model(
            input_ids=feed,
            attention_mask=mask,
            position_ids=next_pos.unsqueeze(1) + torch.arange(k + 1),
            past_key_values=cache,
            use_cache=True,
            output_hidden_states=self.draft is not None,
        )
        aux = self.target.features(out.hidden_states) if self.draft is not None else None
        next_pos = next_pos.clone()
        for r, (b, (drafts, q)) in enumerate(zip(live, proposals, strict=True)):
            row, logits = rows[b], out.logits[r]
            if aux is None:
                tokens = [_pick(logits[-1], row.s, row.rng)]
            else:
                tokens = _verify(logits, drafts, q, row.s, row.rng)
                accepted = len(tokens) - 1
                # the drafts after the accepted ones leave the row's attention for good
                mask[r, mask.shape[1] - k + accepted :] = 0
                row.aux.append(aux[r, : accepted + 1])
                assert row.tally is not None
                row.tally.step(accepted)
            row.commit(logits, tokens)
            next_pos[r] += len(tokens)
        return mask, next_pos


def _verify(
    logits: torch.Tensor, drafts: list[int], q: list[list[float]], s: Sampling, rng: random.Random
) -> list[int]:
    """The tokens the lossless verifier commits: the accepted drafts and one of the target's."""
    if s.greedy:  # the verifier reads rows up to the first rejection: convert only those
        return list(verify_greedy(_LazyRows(logits), drafts).tokens)
    p = [distribution(row, s).tolist() for row in logits]
    return list(verify_sampling(p, q, drafts, rng).tokens)


class _LazyRows(Sequence[list[float]]):
    """The rows of a logits tensor as lists, each converted when read."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def __len__(self) -> int:
        return int(self.logits.shape[0])

    @overload
    def __getitem__(self, i: int) -> list[float]: ...
    @overload
    def __getitem__(self, i: slice) -> list[list[float]]: ...
    def __getitem__(self, i: int | slice) -> list[float] | list[list[float]]:
        return self.logits[i].tolist()


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
        results = self.generator.generate_many(
            [i.input_ids for i in items],
            [i.sampling for i in items],
            [0 if i.sampling.greedy else i.seed for i in items],
            [i.max_new for i in items],
            stops,
            scorers,
        )
        return [
            Generation(ids, counters, scorer.rows if scorer is not None else None)
            for (ids, counters), scorer in zip(results, scorers, strict=True)
        ]


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
