"""The emulator's model backends: a request in; output ids, spec counters and logprob rows out.

Why: the HTTP surface, SGLang's stop rules, ``meta_info`` and the speculative bookkeeping are
the emulator's, whichever model answers. The fake model (``fake_model.py``) is one backend; a
real transformers model (``--emu-model-backend transformers``: the package
``sglang_emulator_transformers``, which needs torch and is not part of the runtime wheel) is
another. A backend that speculates with a real draft returns its own verify counters; the fake
model has no draft, so the emulator draws its counters from the acceptance profile
(``speculating.Speculator``). One flag resolver (``speculating.resolve_settings``) serves both.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from sglang_emulator.logprobs import Scored
from sglang_emulator.speculation import SpecCounters

if TYPE_CHECKING:
    from sglang_emulator.args import EmulatorArgs
    from sglang_emulator.fake_model import FakeModel
    from sglang_emulator.protocol import Item
    from sglang_emulator.speculating import SpecSettings
    from sglang_emulator.vocab import Vocab

__all__ = ["Backend", "BackendError", "Batcher", "FakeBackend", "Generation", "Scored"]


class BackendError(ValueError):
    """A backend that cannot serve these arguments (a missing model, a draft that does not fit)."""


@dataclass(slots=True)
class Generation:
    """One request's answer from a backend.

    ``ids``: the model's output stream; the emulator applies SGLang's stop rules to it (a
    backend may stop early at a stop id or the limit, keeping the stop id). ``counters``: a real
    draft's verify counts (None: not speculating, or nothing real to count). ``rows``: the
    model's own logprob row of each output id (None: the emulator's synthetic logprobs)."""

    ids: list[int]
    counters: SpecCounters | None = None
    rows: list[Scored] | None = None


class Backend(Protocol):
    """What answers ``/generate``. ``max_batch`` > 1: the emulator hands it the requests in
    flight together (``Batcher``), off the event loop; 1: each request inline, in order."""

    max_batch: int

    def generate(self, items: list[Item]) -> list[Generation]: ...


class FakeBackend:
    """The fake model: a deterministic stream per prompt (per tier length with
    ``--emu-output-by-max-new``), no logprob rows, no draft."""

    max_batch = 1

    def __init__(self, model: FakeModel, by_max_new: dict[int, FakeModel]) -> None:
        self.model = model
        self.by_max_new = by_max_new

    def generate(self, items: list[Item]) -> list[Generation]:
        out = []
        for item in items:
            model = self.by_max_new.get(item.sampling.max_new_tokens or 0, self.model)
            seed = 0 if item.sampling.greedy else item.seed
            ids = model.generate(item.input_ids, item.digest, seed, item.max_new, item.packed)
            out.append(Generation(ids))
        return out


class Batcher:
    """Continuous hand-off for a batching backend: requests that arrive while a batch runs wait
    and form the next batch (up to ``max_batch``); a batch runs in a worker thread, so the event
    loop keeps accepting requests (and answering /health) meanwhile."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.queue: list[tuple[Item, asyncio.Future[Generation]]] = []
        self.worker: asyncio.Task[None] | None = None

    async def submit(self, item: Item) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self.queue.append((item, future))
        if self.worker is None or self.worker.done():
            self.worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self.queue:
            batch = self.queue[: self.backend.max_batch]
            del self.queue[: len(batch)]
            live = [(item, f) for item, f in batch if not f.cancelled()]
            if not live:
                continue
            try:
                answers = await asyncio.to_thread(self.backend.generate, [item for item, _ in live])
            except Exception as e:
                for _, f in live:
                    if not f.done():
                        f.set_exception(e)
                continue
            for (_, f), answer in zip(live, answers, strict=True):
                if not f.done():
                    f.set_result(answer)


# --emu-model-backend NAME -> the module that provides ``load(args, settings, vocab)``.
_BACKENDS = {"transformers": "sglang_emulator_transformers"}


def load_backend(
    name: str, args: EmulatorArgs, settings: SpecSettings | None, vocab: Vocab
) -> Backend:
    """A real-model backend, imported only when asked for (it needs torch)."""
    module_name = _BACKENDS[name]
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise BackendError(
            f"--emu-model-backend {name} needs torch and transformers ({e}); it runs in the "
            "lab's environment (trainers/setup.sh speculators)"
        ) from None
    backend: Backend = module.load(args, settings, vocab)
    return backend
