"""What the emulator reports about itself: ``/model_info``, ``/server_info``, ``/v1/models``, the
load behind ``/metrics`` and ``/v1/loads``, and ``/emulator/stats``, in SGLang 0.5.23's shapes."""

from __future__ import annotations

from typing import Any, Protocol

from sglang_emulator.args import SGLANG_FLAGS, SGLANG_VERSION, EmulatorArgs
from sglang_emulator.latency import SlotPool, Stats
from sglang_emulator.metrics import LoadView
from sglang_emulator.protocol import Limits
from sglang_emulator.scheduler import PhysicsScheduler
from sglang_emulator.speculating import Speculator
from sglang_emulator.vocab import Vocab


class EmulatorState(Protocol):
    """What these reports read of the server's state (server.Emulator has it; this module
    does not import the server, which imports it)."""

    args: EmulatorArgs
    vocab: Vocab
    limits: Limits
    seed: int
    speculator: Speculator | None
    max_running_requests: int | None
    stats: Stats
    pool: SlotPool
    physics: PhysicsScheduler | None
    totals: dict[str, int]
    startup_time: float
    served_model_name: str


# The SGLang flags the emulator models (args.SGLANG_FLAGS), always in /server_info; SGLang's
# other flags only when given (SGLang reports ~550 resolved args; the pipeline reads a few).
_MODELLED = frozenset(names[0].lstrip("-").replace("-", "_") for names, *_ in SGLANG_FLAGS)


def model_info(emu: EmulatorState) -> dict[str, Any]:
    """``/model_info``: what SGLang 0.5.23 reports about the served model."""
    a = emu.args
    return {
        "model_path": a.model_path,
        "served_model_name": emu.served_model_name,
        "tokenizer_path": a.tokenizer_path or a.model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": "auto",
        "reasoning_parser": a.reasoning_parser,
        "tool_call_parser": a.tool_call_parser,
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": emu.vocab.meta.model_type,
        "architectures": emu.vocab.meta.architectures,
    }


def server_args(emu: EmulatorState) -> dict[str, Any]:
    """The resolved server args, flat like ``ServerArgs``. As SGLang 0.5.23 does, the API
    key is reported in plaintext (``admin_api_key`` is not); ``--emu-*`` flags are not."""
    a = emu.args
    skip = {"api_key", "admin_api_key", "model_path", "tokenizer_path"}
    spec = emu.speculator.settings.server_fields() if emu.speculator is not None else {}
    flags = {
        k: v
        for k, v in vars(a.ns).items()
        if k not in skip and not k.startswith("emu_") and (k in _MODELLED or v not in (None, False))
    }
    return {
        "model_path": a.model_path,
        "tokenizer_path": a.tokenizer_path or a.model_path,
        "tokenizer_mode": "auto",
        "load_format": "auto",
        "dtype": "auto",
        "is_embedding": False,
        "pp_size": 1,
        "schedule_policy": "fcfs",
        "max_prefill_tokens": 16384,
        **flags,
        "served_model_name": emu.served_model_name,
        "mem_fraction_static": a.mem_fraction_static if a.mem_fraction_static is not None else 0.85,
        "chunked_prefill_size": a.chunked_prefill_size
        if a.chunked_prefill_size is not None
        else 8192,
        "hicache_ratio": a.hicache_ratio if a.hicache_ratio is not None else 2.0,
        "max_running_requests": emu.max_running_requests,
        **spec,
        "random_seed": emu.seed,
        "api_key": a.api_key,
        "admin_api_key": None,
    }


def server_info(emu: EmulatorState) -> dict[str, Any]:
    """``/server_info``: the server args, limits and per-rank internal states."""
    args = server_args(emu)
    limits = emu.limits
    per_dp = emu.pool.slots or emu.max_running_requests or 4096
    spec = emu.speculator.internal_state() if emu.speculator is not None else {}
    internal = {
        **args,
        "last_gen_throughput": 0.0,
        "memory_usage": {
            "weight": 0.0,
            "kvcache": 0.0,
            "token_capacity": limits.max_total_num_tokens,
            "graph": 0.0,
        },
        "effective_max_running_requests_per_dp": per_dp,
        **spec,
    }
    info = {
        **args,
        "launch_command": emu.args.launch_command,
        "max_total_num_tokens": limits.max_total_num_tokens,
        "max_req_input_len": limits.max_req_input_len,
        "kv_events": None,
        "startup_time": emu.startup_time,
        "internal_states": [internal for _ in range(max(1, emu.args.dp_size))],
        "version": SGLANG_VERSION,
        "frontend": "python",
        "emulator": True,
    }
    return info


def models(emu: EmulatorState) -> dict[str, Any]:
    """``/v1/models``: the one served model, with its context length."""
    card = {
        "id": emu.served_model_name,
        "object": "model",
        "created": int(emu.startup_time),
        "owned_by": "sglang",
        "root": emu.served_model_name,
        "parent": None,
        "max_model_len": emu.limits.context_len,
    }
    return {"object": "list", "data": [card]}


def load_view(emu: EmulatorState) -> LoadView:
    """The server's load now, from the physics scheduler or the plain slot counters."""
    t, p = emu.totals, emu.physics
    common = {
        "prompt_tokens_total": t["prompt_tokens"],
        "generation_tokens_total": t["generation_tokens"],
        "requests_total": t["requests"],
        "max_total_num_tokens": emu.limits.max_total_num_tokens,
    }
    if p is None:
        return LoadView(
            num_running_reqs=emu.stats.running,
            num_queue_reqs=emu.stats.queued,
            num_used_tokens=0,
            max_running_requests=emu.pool.slots or 0,
            gen_throughput=0.0,
            new_token_ratio=0.0,
            retracted_requests_total=0,
            retracted_input_tokens_total=0,
            retracted_output_tokens_total=0,
            **common,
        )
    c = p.counters
    return LoadView(
        num_running_reqs=p.num_running,
        num_queue_reqs=p.num_queued,
        num_used_tokens=p.used_tokens(),
        max_running_requests=p.max_running,
        gen_throughput=p.gen_throughput,
        new_token_ratio=p.new_token_ratio,
        retracted_requests_total=c.retracted,
        retracted_input_tokens_total=c.retracted_input_tokens,
        retracted_output_tokens_total=c.retracted_output_tokens,
        idle_s=c.idle_s,
        **common,
    )


def emulator_stats(emu: EmulatorState) -> dict[str, Any]:
    """``/emulator/stats``: the request counters, and the physics scheduler's when it runs."""
    snap = emu.stats.snapshot()
    if emu.physics is not None:
        c = emu.physics.counters
        snap["physics"] = {
            "profile": emu.physics.profile.name,
            "time_scale": emu.physics.scale,
            "max_total_num_tokens": emu.physics.pool,
            "retracted": c.retracted,
            "prefill_steps": c.prefill_steps,
            "decode_steps": c.decode_steps,
            "generated_tokens": c.generated_tokens,
            "prompt_tokens_computed": c.prompt_tokens_computed,
            "sim_s": c.sim_s,
            "lag_s": c.lag_s,
            "lag_lost_s": c.lag_lost_s,
            "idle_s": c.idle_s,
            "new_token_ratio": emu.physics.new_token_ratio,
        }
    return snap
