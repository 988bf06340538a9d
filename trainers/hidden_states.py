"""The target's hidden states for both trainers, from a Hugging Face forward on CPU.

A stand-in for what vLLM (speculators) or SGLang (SpecForge) capture on a GPU node, in each
trainer's own file layout, for the harness's tiny target. Capture points (the same three
layers for both trainers, so the drafts see the same features):
- aux states: the input of layers 1, 2, 3 (vLLM's aux layer ids 1 2 3; SGLang's
  aux_hidden_state_layer_ids 0 1 2 = the output of layers 0, 1, 2);
- speculators: the last layer's output *before* the final norm (its draft applies the
  target's norm and lm_head itself), per row i of the prepared dataset:
  hidden_states/hs_<i>.safetensors {token_ids [seq], hidden_states [seq, 4, hidden]};
- SpecForge: the final state *after* the norm (its TargetHead applies lm_head directly), per
  row i of the export: rows_0-<n>/data_<i>.ckpt {input_ids, loss_mask, aux_hidden_state
  [1, seq, 3*hidden], hidden_state [1, seq, hidden]} in the model dtype (bf16 here, as SGLang).

usage: python hidden_states.py speculators TARGET PREPARED_DIR
       python hidden_states.py specforge TARGET EXPORT.jsonl OUT_DIR
"""

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

# LAB_AUX_LAYERS moves them (the real lab's 30-layer target: "2 15 27", speculators' default
# of 2, L/2, L-3); the draft is trained with the same --target-layer-ids.
AUX_LAYERS = tuple(int(x) for x in os.environ.get("LAB_AUX_LAYERS", "1 2 3").split())


def capture(model, ids: list[int]) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Aux states (inputs of AUX_LAYERS), the last layer's output before the norm, logits."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        model.model.layers[i].register_forward_pre_hook(
            lambda _m, args, kwargs, i=i: seen.__setitem__(f"in{i}", _first(args, kwargs)),
            with_kwargs=True,
        )
        for i in AUX_LAYERS
    ]
    hooks.append(
        model.model.norm.register_forward_pre_hook(
            lambda _m, args: seen.__setitem__("pre_norm", args[0])
        )
    )
    try:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
    finally:
        for h in hooks:
            h.remove()
    return [seen[f"in{i}"][0] for i in AUX_LAYERS], seen["pre_norm"][0], logits


def _first(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def speculators(target: str, prepared: str) -> None:
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from speculators.data_generation.offline import check_hidden_states

    data = load_from_disk(prepared)
    out = Path(prepared) / "hidden_states"
    out.mkdir(exist_ok=True)
    cache = _RowCache(target)
    model = None  # loaded at the first row the cache lacks
    for i, row in enumerate(data):
        ids = [int(t) for t in row["input_ids"]]
        if cache.link(ids, out / f"hs_{i}.safetensors"):
            continue
        if model is None:
            model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
        aux, last, _ = capture(model, ids)
        payload = {
            "token_ids": torch.tensor(ids, dtype=torch.long),
            "hidden_states": torch.stack([*aux, last], dim=1).contiguous(),
        }
        check_hidden_states(payload, ids)  # speculators' own check
        save_file(payload, str(out / f"hs_{i}.safetensors"))
        cache.keep(ids, out / f"hs_{i}.safetensors")
    print(f"speculators hidden states: {len(data)} rows -> {out} ({cache.hits} from the cache)")


class _RowCache:
    """Hidden states of token sequences already computed, by a hash of the ids (LAB_HS_CACHE).

    The real lab trains drafts on subsets of one dataset (the learning curve, the select rules):
    each subset's rows are rows the full dataset's preparation already ran through the target,
    and the target's forward is most of a preparation's time. Files are hard links (a copy
    where the cache is on another filesystem). Off when LAB_HS_CACHE is unset.
    """

    def __init__(self, target: str) -> None:
        where = os.environ.get("LAB_HS_CACHE")
        self.dir = Path(where) if where else None
        if self.dir:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.salt = f"{Path(target).resolve()}|{AUX_LAYERS}".encode()
        self.hits = 0

    def _path(self, ids: list[int]) -> Path | None:
        if self.dir is None:
            return None
        digest = hashlib.sha256(self.salt + torch.tensor(ids).numpy().tobytes()).hexdigest()
        return self.dir / f"{digest}.safetensors"

    def link(self, ids: list[int], dest: Path) -> bool:
        src = self._path(ids)
        if src is None or not src.exists():
            return False
        dest.unlink(missing_ok=True)
        _link_or_copy(src, dest)
        self.hits += 1
        return True

    def keep(self, ids: list[int], made: Path) -> None:
        src = self._path(ids)
        if src is not None and not src.exists():
            _link_or_copy(made, src)


def _link_or_copy(src: Path, dest: Path) -> None:
    """A hard link; a copy where the two are on different filesystems."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def specforge(target: str, export: str, out_dir: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.bfloat16).eval()
    rows = [json.loads(line) for line in Path(export).read_text().splitlines()]
    out = Path(out_dir) / f"rows_0-{len(rows)}"
    out.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate(rows):
        aux, last, logits = capture(model, row["input_ids"])
        final = model.model.norm(last)
        assert torch.equal(model.lm_head(final), logits), "post-norm state must give the logits"
        torch.save(
            {
                "input_ids": torch.tensor(row["input_ids"], dtype=torch.long),
                "loss_mask": torch.tensor(row["loss_mask"], dtype=torch.long),
                "aux_hidden_state": torch.cat(aux, dim=-1).unsqueeze(0).contiguous(),
                "hidden_state": final.unsqueeze(0).contiguous(),
            },
            out / f"data_{i:06d}.ckpt",
        )
    print(f"SpecForge features: {len(rows)} rows -> {out}")


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    {"speculators": speculators, "specforge": specforge}[mode](*rest)
