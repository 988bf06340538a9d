"""Server physics profiles: how long a step takes and how much KV cache there is.

Opt in with ``--emu-physics PROFILE``; without it the emulator keeps its old latency model
(``latency.py``), which the test suite relies on for speed. With a profile, ``/generate``
requests go through :mod:`sglang_emulator.scheduler`, a model of SGLang 0.5.23's scheduler loop.

The decode step time is linear in the batch and in the tokens it attends over::

    step_ms(n, kv) = base_ms + per_req_ms * n + per_kv_token_us * kv / 1000

``base_ms`` is the weight-read floor of one forward pass (a memory-bound MoE decode reads the
active experts once per step whatever the batch), ``per_req_ms`` the per-sequence compute and
expert fan-out, and ``per_kv_token_us`` the attention over the batch's KV (MLA reads each cached
token once per step). So one stream is ``1000 / step_ms(1, kv)`` tok/s, and a full batch makes
``n * 1000 / step_ms(n, kv)`` tok/s, which grows with ``n`` but flattens as the per-request and
attention terms take over: the shape every published SGLang decode benchmark has (SGLang's
``bench_one_batch`` and the DeepSeek-V3 / Kimi-K2 serving blogs of the SGLang team).

Numbers (all simulated time; ``--emu-time-scale`` shrinks every sleep, not the model):

- ``seed-node``: Kimi-K2.5 INT4 at TP 8 on 8 x H200, the node the seed ran. Single stream about
  90 tok/s (step 11.1 ms at one request, 2k tokens of context); 930 tok/s at ~25 running and
  1350-1400 at 150 running with ~2.5k tokens each: the seed's measured 930-1350 tok/s under
  load. KV pool 600,000 tokens: MLA keeps (512 + 64) x 2 bytes per token per layer, x 61 layers
  = 70 KB per token; 141 GB x 0.88 (``--mem-fraction-static``) less ~74 GB of INT4 weights per
  GPU leaves ~45 GB, i.e. ~640k tokens. Prefill 25,000 tok/s (MoE prefill is compute-bound;
  order of magnitude for this node, stated as an estimate).
- ``kv-poor``: the same node with a quarter of the KV pool (150,000 tokens; e.g. a larger
  ``--mem-fraction-static`` share left to CUDA graphs and hierarchical-cache buffers, or half
  the GPUs): the seed's 150 in flight with ~2.5k-token outputs needs several times that, so
  SGLang's optimistic admission (``new_token_ratio``) over-admits and retracts.
- ``reasoning``: the seed node serving long reasoning outputs (its intended workload: mean
  8,000 output tokens, sigma 0.6, what Kimi-K2.5's thinking traces look like); at the seed's
  LONG tier of 32 in flight the pool is half used, so more in flight pays.

The emulator's own ceiling (``benchmarks/emulator_ceiling.py``) is the other calibration: a
profile is only usable at a time scale where the emulator's CPU per step stays well below the
scaled step time; the benchmarks run at the scales docs/performance.md states.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    """One server: step costs, KV pool, admission limits, and (optionally) its workload."""

    name: str
    base_ms: float
    per_req_ms: float
    per_kv_token_us: float
    prefill_tokens_per_s: float
    max_total_num_tokens: int
    max_running_requests: int = 1024
    chunked_prefill_size: int = 8192
    prefill_overhead_ms: float = 5.0
    # The workload the profile is meant for, used where --emu-mean-output-tokens /
    # --emu-output-sigma are not given.
    mean_output_tokens: float | None = None
    output_sigma: float | None = None

    def step_ms(self, running: int, kv_tokens: int) -> float:
        """Duration of one decode step of ``running`` requests over ``kv_tokens`` cached."""
        return self.base_ms + self.per_req_ms * running + self.per_kv_token_us * kv_tokens / 1e3

    def prefill_ms(self, tokens: int) -> float:
        """Duration of one prefill (extend) step over ``tokens`` new tokens."""
        return self.prefill_overhead_ms + 1e3 * tokens / self.prefill_tokens_per_s


_SEED = Profile(
    name="seed-node",
    base_ms=10.5,
    per_req_ms=0.35,
    per_kv_token_us=0.12,
    prefill_tokens_per_s=25_000.0,
    max_total_num_tokens=600_000,
    mean_output_tokens=2500.0,
    output_sigma=1.0,
)

PROFILES: dict[str, Profile] = {
    "seed-node": _SEED,
    "kv-poor": Profile(
        **{**_SEED.__dict__, "name": "kv-poor", "max_total_num_tokens": 150_000},
    ),
    "reasoning": Profile(
        **{
            **_SEED.__dict__,
            "name": "reasoning",
            "mean_output_tokens": 8000.0,
            "output_sigma": 0.6,
        },
    ),
}
