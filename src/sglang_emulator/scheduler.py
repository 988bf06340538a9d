"""A model of SGLang 0.5.23's scheduler loop, for ``--emu-physics`` (see ``physics.py``).

What is copied from SGLang, and from where (paths under ``python/sglang/srt/``):

- **One batch per iteration, prefill first.** ``Scheduler.get_next_batch_to_run``
  (``managers/scheduler.py:3894``) runs a prefill (extend) batch when one can be formed from
  the waiting queue, else one decode step of the running batch. Prefill is chunked: at most
  ``chunked_prefill_size`` new tokens per prefill step, one request may be split across steps
  (``PrefillAdder`` chunked branch, ``managers/schedule_policy.py:1352-1380``).
- **Admission by new-token ratio.** A waiting request is admitted, in FCFS order, while
  ``prompt (+ output so far) + min(max_new - out, 4096)`` fits in what is left of the KV pool
  after every running request's ``min(max_new - out, 4096) * new_token_ratio``
  (``PrefillAdder._get_running_request_total_token_offset``, ``schedule_policy.py:785-795``;
  ``add_one_req``, ``schedule_policy.py:1394-1410``; ``CLIP_MAX_NEW_TOKENS`` = 4096,
  ``schedule_policy.py:89``); the first one that does not fit stops admission.
  ``new_token_ratio`` starts at 0.7, decays by ``(0.7 - 0.7 * 0.14) / 600`` per decode step to
  its floor 0.098 (``managers/scheduler_components/new_token_ratio_tracker.py``;
  ``SGLANG_INIT_NEW_TOKEN_RATIO``, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``,
  ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` in ``environ.py:646-648``). Requests that finish early
  are the reason it decays: the scheduler learns to expect short outputs and admits more.
- **Retraction.** Before a decode step, if the pool cannot give every running request its next
  token (``check_decode_mem``, ``schedule_batch.py:3432``), ``retract_decode``
  (``schedule_batch.py:3451``) frees requests, those with the fewest output tokens first and,
  among them, the longest prompt (``_get_decode_retraction_order``, ``schedule_batch.py:3541``),
  until the step fits (at least one, always keeping one). A retracted request keeps its output
  tokens but loses its KV: it goes to the back of the waiting queue
  (``scheduler.py:4539-4540``) and is prefilled again, prompt plus output so far, when admitted.
  Its ``retraction_count`` grows (``Req.reset_for_retract``, ``schedule_batch.py:2049``) and is
  reported as ``meta_info.num_retractions``. The ratio is then reset to
  ``(decoded + 20 * running) / (sum of max_new + 1)`` over the requests left
  (``estimate_new_token_ratio_after_retract``; ``SGLANG_RETRACT_DECODE_STEPS`` = 20).
- **Metrics.** ``num_running_reqs``, ``num_queue_reqs``, ``token_usage`` (KV used / pool),
  ``gen_throughput`` (tokens generated over the last decode log interval, 40 steps by default),
  ``num_retracted_requests_total`` and ``new_token_ratio`` (``observability/
  metrics_collector.py:365-721``); rendered by ``metrics.py``.

What is not modelled: the radix (prefix) cache and hierarchical cache, mixed prefill+decode
batches, overlap scheduling, speculative decoding, paging (page size 1).

Cost: consecutive decode steps with nothing to decide between them (no finish, no admission
possible, no retraction) are slept through as one, so the emulator's CPU is per event, not
per step; a time scale (``--emu-time-scale``) shrinks every sleep by the same factor.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from dataclasses import dataclass, field

from sglang_emulator.latency import Stats
from sglang_emulator.physics import Profile

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py:89
INIT_NEW_TOKEN_RATIO = 0.7  # environ.py:646
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # environ.py:647
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # environ.py:648
RETRACT_DECODE_STEPS = 20  # environ.py:649
DECODE_LOG_INTERVAL = 40  # server_args.py decode_log_interval: gen_throughput's window
_MAX_REAL_SLEEP_S = 0.005  # longest stretch of decode steps slept through at once
_ADMIT_RECHECK_STEPS = 8  # with requests waiting, admission is retried this often


@dataclass(eq=False, slots=True)
class Job:
    """One request inside the scheduler."""

    n_in: int
    n_out: int  # output tokens it will produce (the fake model decides this up front)
    max_new: int
    ignore_eos: bool
    fut: asyncio.Future[int]
    generated: int = 0  # while not running; while running: scheduler.step - base
    base: int = 0
    prefilled: int = 0  # tokens of the current fill already in the KV pool (chunked prefill)
    retractions: int = 0
    state: str = "waiting"  # waiting | prefill | running | done

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def fill(self) -> int:
        """Tokens a prefill must compute: the prompt plus any output kept across a retraction."""
        return self.n_in + self.generated


@dataclass
class Counters:
    """Totals behind ``/metrics``."""

    retracted: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    prefill_steps: int = 0
    decode_steps: int = 0
    generated_tokens: int = 0
    prompt_tokens_computed: int = 0
    sim_s: float = 0.0  # simulated seconds of server work
    lag_s: float = 0.0  # worst real-time lag behind the simulated clock (emulator too slow)
    lag_lost_s: float = 0.0  # real seconds behind the clock never caught up (sum, forgiven)
    idle_s: float = 0.0  # real seconds with nothing waiting, prefilling or running
    extra: dict[str, float] = field(default_factory=dict)


def _live(entry: tuple[int, int, Job]) -> bool:
    """A heap entry still describes its job's finish (not left over from before a retraction)."""
    finish, _, job = entry
    return job.running and finish == job.base + job.n_out


class PhysicsScheduler:
    """Runs requests through the modelled scheduler; ``await run(...)`` returns its retractions."""

    def __init__(
        self,
        profile: Profile,
        *,
        stats: Stats,
        time_scale: float = 1.0,
        max_running_requests: int | None = None,
        max_total_num_tokens: int | None = None,
    ) -> None:
        self.profile = profile
        self.stats = stats
        self.scale = time_scale
        self.max_running = max_running_requests or profile.max_running_requests
        self.pool = max_total_num_tokens or profile.max_total_num_tokens
        self.chunk = profile.chunked_prefill_size
        self.waiting: deque[Job] = deque()
        self.running: set[Job] = set()
        self.chunked: Job | None = None
        self.step = 0
        self._in_sum = 0  # sum of n_in over running
        self._base_sum = 0  # sum of base over running
        self._heap: list[tuple[int, int, Job]] = []  # (finish step, seq, job)
        self._seq = 0
        self.ratio_init = INIT_NEW_TOKEN_RATIO
        self.ratio_min = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.ratio_init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.ratio_init
        self.counters = Counters()
        self.gen_throughput = 0.0
        self._tput_t = time.monotonic()
        self._tput_tokens = 0
        self._tput_steps = 0
        self._arrival = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0

    # ----- what the handlers and /metrics see -----

    def used_tokens(self) -> int:
        """KV tokens held: running requests' prompt + output, and a chunked prefill's part."""
        used = self._in_sum + len(self.running) * self.step - self._base_sum
        return used + (self.chunked.prefilled if self.chunked is not None else 0)

    @property
    def num_running(self) -> int:
        return len(self.running) + (1 if self.chunked is not None else 0)

    @property
    def num_queued(self) -> int:
        return len(self.waiting)

    @property
    def token_usage(self) -> float:
        return self.used_tokens() / self.pool

    async def run(self, n_in: int, n_out: int, max_new: int, ignore_eos: bool) -> int:
        """Queue one request and wait until it has produced ``n_out`` tokens."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        job = Job(n_in, max(1, n_out), max(1, max_new), ignore_eos, fut)
        self.waiting.append(job)
        self.stats.enqueue()
        self._arrival.set()
        try:
            return await fut
        except asyncio.CancelledError:
            self._drop(job)
            raise

    def _drop(self, job: Job) -> None:
        """A client went away: free what its request held."""
        if job.state == "running":
            self._leave_running(job)
            self.stats.stop_running()
        elif job.state == "prefill":
            if self.chunked is job:
                self.chunked = None
            self.stats.stop_running()
        elif job.state == "waiting":
            try:
                self.waiting.remove(job)
            except ValueError:
                pass
            else:
                self.stats.dequeue()
        job.state = "done"

    # ----- the loop -----

    async def _loop(self) -> None:
        self._deadline = time.monotonic()
        while True:
            if not self.waiting and not self.running and self.chunked is None:
                self.new_token_ratio = self.ratio_init  # idle: reset (scheduler.py:5318)
                self._arrival.clear()
                idle_from = self._forgive_lag()
                await self._arrival.wait()
                self._deadline = time.monotonic()
                self.counters.idle_s += self._deadline - idle_from
                continue
            batch = self._admit()
            if batch:
                await self._prefill(batch)
            elif self.running:
                await self._decode()
            else:  # waiting requests that cannot be admitted and nothing running: wait
                self._arrival.clear()
                self._forgive_lag()
                await self._arrival.wait()
                self._deadline = time.monotonic()

    async def _sleep_sim(self, sim_ms: float) -> None:
        """Advance the simulated clock; sleep so that it keeps pace with real time x scale."""
        self.counters.sim_s += sim_ms / 1e3
        self._deadline += sim_ms / 1e3 * self.scale
        delay = self._deadline - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            self.counters.lag_s = max(self.counters.lag_s, -delay)
            if -delay > 0.25:  # hopelessly behind (a stall): do not try to catch up
                self._forgive_lag()
            await asyncio.sleep(0)

    def _forgive_lag(self) -> float:
        """Restart the scaled clock at now (a stall, or going idle), counting the real time it
        lost in ``lag_lost_s``: wall time = simulated work x scale + idle + lag lost."""
        now = time.monotonic()
        self.counters.lag_lost_s += max(0.0, now - self._deadline)
        self._deadline = now
        return now

    def _reserved_by_running(self) -> float:
        """``sum(min(max_new - out, 4096) * ratio)`` over running (schedule_policy.py:785)."""
        step, ratio = self.step, self.new_token_ratio
        total = 0.0
        for j in self.running:
            left = min(j.max_new - (step - j.base), CLIP_MAX_NEW_TOKENS)
            if left > 0:
                total += left * (1.0 if j.ignore_eos else ratio)
        return total

    def _admit(self) -> list[tuple[Job, int]]:
        """The next prefill batch: (job, tokens to compute this step); empty if none fits."""
        rem_chunk = self.chunk
        batch: list[tuple[Job, int]] = []
        if self.chunked is not None:  # a chunked request continues first
            job = self.chunked
            take = min(job.fill - job.prefilled, rem_chunk)
            batch.append((job, take))
            rem_chunk -= take
        if not self.waiting or rem_chunk <= 0:
            return batch
        count = self.num_running
        if count >= self.max_running:
            return batch
        rem_total = self.pool - self.used_tokens() - self._reserved_by_running()
        while self.waiting and count < self.max_running and rem_chunk > 0:
            job = self.waiting[0]
            need = job.fill + min(max(job.max_new - job.generated, 0), CLIP_MAX_NEW_TOKENS)
            if need > rem_total:
                break  # AddReqResult.NO_TOKEN: admission stops at the first that does not fit
            take = min(job.fill, rem_chunk)
            if take < job.fill and self.chunked is not None:
                break  # one chunked request at a time
            self.waiting.popleft()
            self.stats.dequeue()
            self.stats.start_running()
            job.state = "prefill"
            job.prefilled = 0
            if take < job.fill:
                self.chunked = job
            batch.append((job, take))
            rem_total -= need
            rem_chunk -= take
            count += 1
        return batch

    async def _prefill(self, batch: list[tuple[Job, int]]) -> None:
        tokens = sum(t for _, t in batch)
        for job, take in batch:
            job.prefilled += take
        self.counters.prefill_steps += 1
        self.counters.prompt_tokens_computed += tokens
        await self._sleep_sim(self.profile.prefill_ms(tokens))
        for job, _ in batch:
            if job.state != "prefill" or job.prefilled < job.fill:
                continue  # dropped meanwhile, or chunked: more next step
            if self.chunked is job:
                self.chunked = None
            # The prefill's forward pass samples the first output token.
            job.generated += 1
            self.counters.generated_tokens += 1
            if job.generated >= job.n_out:
                self._finish(job)
                continue
            self._join_running(job)

    def _finish(self, job: Job) -> None:
        job.state = "done"
        self.stats.stop_running()
        if not job.fut.done():
            job.fut.set_result(job.retractions)

    def _join_running(self, job: Job) -> None:
        job.base = self.step - job.generated
        job.state = "running"
        self.running.add(job)
        self._in_sum += job.n_in
        self._base_sum += job.base
        self._seq += 1
        heapq.heappush(self._heap, (job.base + job.n_out, self._seq, job))

    def _leave_running(self, job: Job) -> None:
        job.generated = self.step - job.base
        job.state = "waiting"
        self.running.discard(job)
        self._in_sum -= job.n_in
        self._base_sum -= job.base

    async def _decode(self) -> None:
        n = len(self.running)
        used = self.used_tokens()
        free = self.pool - used
        if free < n:
            self._retract()
            return
        heap = self._heap
        while heap and not _live(heap[0]):
            heapq.heappop(heap)  # stale entry (finished, retracted or dropped)
        k_finish = heap[0][0] - self.step if heap else 1
        step_ms = self.profile.step_ms(n, used)
        k_cap = max(1, int(_MAX_REAL_SLEEP_S / max(step_ms / 1e3 * self.scale, 1e-9)))
        k = max(1, min(k_finish, free // n, k_cap))
        if self.waiting:
            k = min(k, _ADMIT_RECHECK_STEPS)
        sim_ms = k * self.profile.step_ms(n, used + n * (k - 1) // 2)
        await self._sleep_sim(sim_ms)
        self.step += k
        self.counters.decode_steps += k
        self.counters.generated_tokens += n * k
        self.new_token_ratio = max(self.ratio_min, self.new_token_ratio - self.ratio_decay * k)
        self._track_throughput(n * k, k)
        while heap and heap[0][0] <= self.step:
            _, _, job = heapq.heappop(heap)
            if not job.running or job.base + job.n_out > self.step:
                continue
            self._leave_running(job)
            self._finish(job)

    def _track_throughput(self, tokens: int, steps: int) -> None:
        """``gen_throughput``: tokens over the last ``decode_log_interval`` steps, real time."""
        self._tput_tokens += tokens
        self._tput_steps += steps
        if self._tput_steps >= DECODE_LOG_INTERVAL:
            now = time.monotonic()
            if now > self._tput_t:
                self.gen_throughput = self._tput_tokens / (now - self._tput_t)
            self._tput_t, self._tput_tokens, self._tput_steps = now, 0, 0

    def _retract(self) -> None:
        """``retract_decode`` (schedule_batch.py:3451): free requests until the step fits."""
        step = self.step
        order = sorted(
            self.running, key=lambda j: (step - j.base, -j.n_in), reverse=True
        )  # most worth keeping first; retracted from the end
        free = self.pool - self.used_tokens()
        first = True
        while first or free < len(order):
            if len(order) == 1:
                break
            first = False
            job = order.pop()
            self._leave_running(job)
            self.stats.stop_running()
            free += job.n_in + job.generated
            job.retractions += 1
            job.prefilled = 0
            c = self.counters
            c.retracted += 1
            c.retracted_input_tokens += job.n_in
            c.retracted_output_tokens += job.generated
            self.waiting.append(job)
            self.stats.enqueue()
        decoded = sum(step - j.base for j in order)
        max_new = sum(j.max_new for j in order)
        self.new_token_ratio = min(
            1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / (max_new + 1)
        )
