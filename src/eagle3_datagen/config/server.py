"""The SGLang server a run launches or attaches to, and the auto-concurrency controller's limits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from eagle3_datagen.config.base import Count, PositiveSeconds, StrictModel

# The seed's production server: python -m sglang.launch_server ... (docs/contract.md)
DEFAULT_TP_SIZE = 8
DEFAULT_MEM_FRACTION = 0.88
DEFAULT_HICACHE_SIZE_GB = 48
DEFAULT_CONTINUOUS_DECODE_STEPS = 4
DEFAULT_PORT = 8000

REASONING_PARSER_FLAG = "--reasoning-parser"
# SGLang's launch parser takes any unambiguous prefix of a flag (argparse's allow_abbrev); no
# other SGLang 0.5.23 flag starts with "--rea", so from there on a prefix means this one.
_SHORTEST_REASONING_PARSER_PREFIX = len("--rea")


def names_reasoning_parser(arg: str) -> bool:
    """True when SGLang would read ``arg`` as ``--reasoning-parser``: the flag itself, an
    abbreviation of it (``--reasoning-pars``), or either with ``=value``."""
    name = arg.split("=", 1)[0]
    return len(name) >= _SHORTEST_REASONING_PARSER_PREFIX and REASONING_PARSER_FLAG.startswith(name)


class AutoConcurrency(StrictModel):
    """The controller behind ``concurrency: auto``: limits and pace, shared by all its tiers."""

    initial: Count = Field(default=64, title="Initial")
    """Requests in flight (server-wide) at start."""
    minimum: Count = Field(default=4, title="Minimum")
    """Never fewer in flight."""
    maximum: Count = Field(default=2048, title="Maximum")
    """Never more in flight (server-wide)."""
    interval_s: PositiveSeconds = Field(default=2.0, title="Interval (s)")
    """How often the server's load is read and the limit adjusted."""


class SpeculativeSpec(StrictModel):
    """Launch the server speculating with an EAGLE-3 draft, to measure the draft's acceptance
    on the data as it is generated (docs/acceptance.md). Lossless: the tokens keep the
    target's distribution, so it is not part of the fingerprint's content."""

    algorithm: Literal["EAGLE3", "EAGLE"] = Field(default="EAGLE3", title="Algorithm")
    """--speculative-algorithm."""
    draft_model_path: str = Field(title="Draft model path")
    """--speculative-draft-model-path: the draft checkpoint directory (checked before launch:
    readable, and its vocabulary and hidden size fit the target's)."""
    num_steps: Count = Field(default=3, title="Draft steps")
    """--speculative-num-steps."""
    eagle_topk: Count = Field(default=1, title="Draft top-k")
    """--speculative-eagle-topk."""
    num_draft_tokens: int | None = Field(default=None, ge=2, title="Draft tokens")
    """--speculative-num-draft-tokens; None: num_steps + 1, which SGLang forces under eagle_topk
    1."""

    @model_validator(mode="after")
    def _chain_tokens(self) -> SpeculativeSpec:
        if self.eagle_topk == 1 and self.num_draft_tokens not in (None, self.num_steps + 1):
            raise ValueError(
                f"server.speculative.num_draft_tokens {self.num_draft_tokens}: with eagle_topk "
                f"1 SGLang makes it num_steps + 1 = {self.num_steps + 1}; leave it unset"
            )
        return self

    @property
    def draft_tokens(self) -> int:
        """The resolved ``--speculative-num-draft-tokens``."""
        if self.num_draft_tokens is None or self.eagle_topk == 1:
            return self.num_steps + 1
        return self.num_draft_tokens


class LaunchFlags(StrictModel):
    """SGLang's launch flags for a server the run launches (attach mode: unused, but pre-flight
    warns where the attached server's tp_size differs from one the config sets)."""

    tp_size: int | None = Field(
        title="Tensor parallel size",
        default=None,
        ge=1,
        description=f"--tp-size (GPUs per server); unset: {DEFAULT_TP_SIZE} when launching, and "
        "an attached server's own is not compared with it.",
    )
    mem_fraction_static: float = Field(
        title="Static memory fraction", default=DEFAULT_MEM_FRACTION, gt=0.0, lt=1.0
    )
    enable_hierarchical_cache: bool = Field(title="Hierarchical cache", default=True)
    hicache_size_gb: int = Field(
        title="Hierarchical cache size (GB)", default=DEFAULT_HICACHE_SIZE_GB, ge=0
    )
    """--hicache-size"""
    num_continuous_decode_steps: Count = Field(
        title="Continuous decode steps",
        default=DEFAULT_CONTINUOUS_DECODE_STEPS,
    )
    random_seed: int = Field(title="Random seed", default=0, ge=0)
    """--random-seed. Fixed, because SGLang otherwise picks a random seed at every launch, so the
    same config would sample differently after each launch or relaunch."""

    @property
    def launch_tp_size(self) -> int:
        """The --tp-size a launched server gets."""
        return self.tp_size if self.tp_size is not None else DEFAULT_TP_SIZE


class ServerLimits(StrictModel):
    """What the run asks of the server at most: requests and tokens in flight across every
    partition, and how long a start and a request may take."""

    startup_timeout_s: PositiveSeconds = Field(title="Startup timeout (s)", default=3600.0)
    """Health-gate deadline; a 1T model loads for tens of minutes."""
    max_requests_in_flight: int | None = Field(
        title="Max requests in flight (server)", default=None, ge=1
    )
    """Server-wide cap on requests in flight across all partitions (None: the sum of the tiers'
    concurrency)."""
    max_tokens_in_flight: int | None = Field(
        title="Max tokens in flight (server)", default=None, ge=1
    )
    """Server-wide cap on prompt + max_tokens summed over requests in flight, i.e. KV cache
    reserved; keeps a LONG tier from crowding out the others. None: no cap."""
    request_timeout_s: PositiveSeconds = Field(title="Request timeout (s)", default=1800.0)
    """Per-request timeout; a 16k-token generation takes minutes."""


class Recovery(StrictModel):
    """When a server counts as lost, and how the run gets it back (launch mode relaunches it)."""

    lost_after_failures: Count = Field(title="Failures before 'lost'", default=5)
    """Consecutive connection failures that mean 'server lost'."""
    max_relaunches: int = Field(title="Max relaunches", default=2, ge=0)
    """Launch mode: relaunches of a lost server before giving up."""
    recovery_check_s: PositiveSeconds = Field(title="Recovery wait (s)", default=60.0)
    """How long a lost server may take to answer again."""


# server.<key> -> the group that holds it now (configs written before the groups still load).
MOVED = {
    **dict.fromkeys(LaunchFlags.model_fields, "launch"),
    **dict.fromkeys(ServerLimits.model_fields, "limits"),
    **dict.fromkeys(Recovery.model_fields, "recovery"),
}


class ServerSpec(StrictModel):
    """The SGLang server: launched by the run (and stopped with it) or attached to by URL."""

    mode: Literal["launch", "attach"] = Field(default="launch", title="Server mode")
    """'launch' starts SGLang for this run; 'attach' uses a running server by URL."""
    engine: Literal["sglang", "emulator"] = Field(default="sglang", title="Engine")
    """'sglang' runs python -m sglang.launch_server; 'emulator' runs the bundled SGLang emulator
    with the same flags (no GPU)."""
    url: str | None = Field(title="Server URL", default=None)
    """Attach mode: the server's base URL, e.g. http://node1:8000; several comma-separated URLs
    spread requests over several servers (or attach to sglang_router)."""
    host: str = Field(title="Host", default="127.0.0.1")
    """Launch mode: --host."""
    port: int = Field(title="Port", default=DEFAULT_PORT, ge=0, le=65535)
    """Launch mode: --port; 0 picks a free port (several servers on one node)."""
    enable_metrics: bool = Field(title="Prometheus metrics", default=False)
    """Launch with --enable-metrics (SGLang's /metrics). A run whose tiers use concurrency 'auto'
    turns it on, since the controller reads the server's load there."""
    auto_concurrency: AutoConcurrency = Field(
        title="Auto concurrency", default_factory=lambda: AutoConcurrency()
    )
    """How tiers with concurrency 'auto' are steered (server-wide)."""
    context_length: int | None = Field(title="Context length", default=None)
    """--context-length; None takes the model's config."""
    speculative: SpeculativeSpec | None = Field(title="Speculative decoding", default=None)
    """Launch mode: speculate with a draft model and record its acceptance per request (attach mode
    reads the server's own settings from /server_info). None: off."""
    extra_args: list[str] = Field(title="Extra launch flags", default_factory=list)
    """More launch_server flags, passed through verbatim."""
    env: dict[str, str] = Field(title="Server environment", default_factory=dict)
    """Environment for the server process, e.g. {"CUDA_VISIBLE_DEVICES": "0,1"}."""
    api_key_env: str | None = Field(title="API key variable", default=None)
    """Name of the environment variable holding SGLang's --api-key (never the key)."""
    api_key_secret: str | None = Field(title="API key Secret block", default=None)
    """Name of a Prefect Secret block holding SGLang's --api-key (instead of api_key_env)."""
    launch: LaunchFlags = Field(title="Launch flags", default_factory=LaunchFlags)
    """SGLang's --tp-size, --mem-fraction-static, hierarchical cache, decode steps and --random-seed
    for a launched server."""
    limits: ServerLimits = Field(title="Limits", default_factory=ServerLimits)
    """What the run asks of the server at most: requests and tokens in flight, how long a start and
    a request may take."""
    recovery: Recovery = Field(title="Recovery", default_factory=Recovery)
    """When a server counts as lost, and how the run gets it back."""

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        """A config written before ``launch``, ``limits`` and ``recovery`` existed still
        loads: its keys
        move into the group that holds them now (both places set: refused, naming the key)."""
        if not isinstance(data, dict) or not MOVED.keys() & data.keys():
            return data
        data = dict(data)
        for key in MOVED.keys() & data.keys():
            group = dict(data.get(MOVED[key]) or {})
            if key in group:
                raise ValueError(
                    f"server.{key} and server.{MOVED[key]}.{key} are both set; keep "
                    f"server.{MOVED[key]}.{key} (server.{key} is its old name)"
                )
            group[key] = data.pop(key)
            data[MOVED[key]] = group
        return data

    @field_validator("extra_args")
    @classmethod
    def _no_reasoning_parser(cls, v: list[str]) -> list[str]:
        for arg in v:
            if names_reasoning_parser(arg):
                raise ValueError(
                    f"{arg!r} is refused: SGLang reads it as --reasoning-parser, which is not "
                    "needed for /generate, and the pipeline requires the raw output_ids of a "
                    "server launched without it"
                )
        return v

    @model_validator(mode="after")
    def _one_key_source(self) -> ServerSpec:
        if self.api_key_env and self.api_key_secret:
            raise ValueError("set server.api_key_env or server.api_key_secret, not both")
        return self

    @model_validator(mode="after")
    def _attach_needs_url(self) -> ServerSpec:
        if self.mode == "attach" and not self.url:
            raise ValueError("server.mode 'attach' needs server.url")
        return self

    @property
    def base_url(self) -> str:
        if self.mode == "attach":
            assert self.url is not None
            return self.url.rstrip("/")
        return f"http://{self.host}:{self.port}"
