"""Pipeline configuration: one pydantic model, loaded from YAML, that is also the flow parameter.

The same :class:`PipelineConfig` is what ``eagle3-datagen run CONFIG.yaml`` loads and what the
Prefect UI renders as the run form, so every field carries a title-worthy description, tiers and
partitions are lists of models (editable with "Add item"), and choices are ``Literal`` dropdowns.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from eagle3_datagen.errors import ConfigError

# The seed's production server: python -m sglang.launch_server ... (docs/contract.md)
DEFAULT_TP_SIZE = 8
DEFAULT_MEM_FRACTION = 0.88
DEFAULT_HICACHE_SIZE_GB = 48
DEFAULT_CONTINUOUS_DECODE_STEPS = 4
DEFAULT_PORT = 8000
AUTO_PARTITION_CAP = 1024  # a tier with concurrency "auto" never has more in flight

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

REASONING_PARSER_FLAG = "--reasoning-parser"
# SGLang's launch parser takes any unambiguous prefix of a flag (argparse's allow_abbrev); no
# other SGLang 0.5.23 flag starts with "--rea", so from there on a prefix means this one.
_SHORTEST_REASONING_PARSER_PREFIX = len("--rea")


def names_reasoning_parser(arg: str) -> bool:
    """True when SGLang would read ``arg`` as ``--reasoning-parser``: the flag itself, an
    abbreviation of it (``--reasoning-pars``), or either with ``=value``."""
    name = arg.split("=", 1)[0]
    return len(name) >= _SHORTEST_REASONING_PARSER_PREFIX and REASONING_PARSER_FLAG.startswith(name)


class _Model(BaseModel):
    """Strict base: unknown keys are typos, and typos in a 100k-prompt run are expensive."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Model):
    """Which model's tokenizer and chat template render the prompts."""

    path: str = Field(
        title="Model path",
        description="Model directory (or hub id) served by SGLang; its tokenizer renders prompts.",
    )
    tokenizer_path: str | None = Field(
        default=None,
        title="Tokenizer path",
        description="Tokenizer directory if different from the model path.",
    )
    trust_remote_code: bool = Field(
        default=True,
        title="Trust remote code",
        description="Passed to AutoTokenizer and to SGLang (Kimi-K2.5 needs it).",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        title="Chat template kwargs",
        description='Extra variables for the chat template, e.g. {"thinking": true}.',
    )
    render: Literal["sglang_chat", "template"] = Field(
        default="sglang_chat",
        title="Render reference",
        description=(
            "sglang_chat: the prompt ids SGLang 0.5.23's /v1/chat/completions builds for the "
            "same request (tool-call arguments parsed, tools as SGLang dumps them, ...); "
            "template: the data through the chat template as it is. See docs/render.md."
        ),
    )

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer_path or self.path


class ToolCallTokens(_Model):
    """Kimi-style tool-call markers; a section holds one or more begin/argument/end calls."""

    section_begin: str = Field(title="Section begin", default="<|tool_calls_section_begin|>")
    section_end: str = Field(title="Section end", default="<|tool_calls_section_end|>")
    call_begin: str = Field(title="Call begin", default="<|tool_call_begin|>")
    argument_begin: str = Field(title="Argument begin", default="<|tool_call_argument_begin|>")
    call_end: str = Field(title="Call end", default="<|tool_call_end|>")


class SpecialTokens(_Model):
    """Special tokens by their *strings*; ids are resolved through the tokenizer at start-up."""

    think_start: str = Field(
        title="Think start", default="<think>", description="Opens the reasoning block."
    )
    think_end: str = Field(
        title="Think end", default="</think>", description="Closes the reasoning block."
    )
    end_of_turn: str = Field(
        title="End of turn",
        default="<|im_end|>",
        description="Ends the assistant turn; the expected last output token.",
    )
    extra_stop: list[str] = Field(
        title="Extra stop tokens",
        default_factory=lambda: ["[EOS]"],
        description="Other tokens that stop generation (sent as stop_token_ids too).",
    )
    role_tokens: list[str] = Field(
        title="Role tokens",
        default_factory=lambda: [
            "<|im_user|>",
            "<|im_system|>",
            "<|im_assistant|>",
            "<|im_middle|>",
        ],
        description="Turn and role tokens that must never appear inside an output.",
    )
    tool_calls: ToolCallTokens | None = Field(
        title="Tool-call tokens",
        default_factory=lambda: ToolCallTokens(),
        description="Tool-call tokens whose structure is checked; null for models without tools.",
    )
    thinking: Literal["prompt", "output", "none"] = Field(
        default="prompt",
        title="Thinking block placement",
        description=(
            "Where <think> opens: 'prompt' (the chat template ends in it, as Kimi-K2.5), "
            "'output' (the model emits it, as DeepSeek-R1), or 'none' (no thinking)."
        ),
    )


class Sampling(_Model):
    """Sampling parameters sent explicitly with every request (SGLang's /generate has no model
    defaults: generation_config.json applies only to the OpenAI chat endpoint).

    The ranges are SGLang 0.5.23's own (``SamplingParams.verify``): a value outside them would
    get a 400 for every prompt, so it is refused here, and pre-flight sends these parameters in
    its smoke request."""

    temperature: float = Field(
        title="Temperature", default=1.0, ge=0.0, allow_inf_nan=False, description="0 means greedy."
    )
    top_p: float = Field(title="Top-p", default=0.95, gt=0.0, le=1.0)
    top_k: int = Field(title="Top-k", default=-1, description="-1 means all tokens.")
    min_p: float = Field(title="Min-p", default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(
        title="Repetition penalty",
        default=1.0,
        gt=0.0,
        le=2.0,
        description="In (0, 2]; 1.0 means no penalty.",
    )
    seed: int | None = Field(
        title="Sampling seed",
        default=None,
        ge=-(2**63),
        le=2**63 - 1,
        description="Base seed: each request gets its own sampling_seed derived from this and the "
        "prompt id, so a prompt samples the same way in every run. SGLang honours it only when "
        "launched with --enable-deterministic-inference (add it to server.extra_args); "
        "otherwise it is ignored. None: no seed is sent.",
    )

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("top_k must be -1 (all) or >= 1")
        return v

    def request_seed(self, prompt_id: str) -> int | None:
        """The ``sampling_seed`` of one prompt: a stable hash of the seed and the prompt id.

        One seed for every request would correlate the sampling noise across prompts; per
        prompt, a rerun or resume still draws the same way for the same prompt.
        """
        if self.seed is None:
            return None
        digest = hashlib.sha256(f"{self.seed}:{prompt_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: within SGLang's int64 range

    def to_sglang(
        self, max_new_tokens: int, stop_token_ids: list[int], prompt_id: str | None = None
    ) -> dict[str, Any]:
        """The ``sampling_params`` dict for /generate; output is never trimmed or re-encoded.

        ``sampling_seed`` is there only for a ``prompt_id`` (see :meth:`request_seed`).
        """
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "stop_token_ids": stop_token_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if prompt_id is not None and (seed := self.request_seed(prompt_id)) is not None:
            params["sampling_seed"] = seed
        return params


class AutoConcurrency(_Model):
    """The controller behind ``concurrency: auto``: limits and pace, shared by all its tiers."""

    initial: int = Field(
        default=64, ge=1, title="Initial", description="Requests in flight (server-wide) at start."
    )
    minimum: int = Field(default=4, ge=1, title="Minimum", description="Never fewer in flight.")
    maximum: int = Field(
        default=2048, ge=1, title="Maximum", description="Never more in flight (server-wide)."
    )
    interval_s: float = Field(
        default=2.0,
        gt=0,
        title="Interval (s)",
        description="How often the server's load is read and the limit adjusted.",
    )


class ServerSpec(_Model):
    """The SGLang server: launched by the run (and stopped with it) or attached to by URL."""

    mode: Literal["launch", "attach"] = Field(
        default="launch",
        title="Server mode",
        description="'launch' starts SGLang for this run; 'attach' uses a running server by URL.",
    )
    engine: Literal["sglang", "emulator"] = Field(
        default="sglang",
        title="Engine",
        description="'sglang' runs python -m sglang.launch_server; 'emulator' runs the bundled "
        "SGLang emulator with the same flags (no GPU).",
    )
    url: str | None = Field(
        title="Server URL",
        default=None,
        description="Attach mode: the server's base URL, e.g. http://node1:8000; several "
        "comma-separated URLs spread requests over several servers (or attach to sglang_router).",
    )
    host: str = Field(title="Host", default="127.0.0.1", description="Launch mode: --host.")
    port: int = Field(
        title="Port",
        default=DEFAULT_PORT,
        ge=0,
        le=65535,
        description="Launch mode: --port; 0 picks a free port (several servers on one node).",
    )
    tp_size: int = Field(
        title="Tensor parallel size",
        default=DEFAULT_TP_SIZE,
        ge=1,
        description="--tp-size (GPUs per server).",
    )
    mem_fraction_static: float = Field(
        title="Static memory fraction", default=DEFAULT_MEM_FRACTION, gt=0.0, lt=1.0
    )
    enable_hierarchical_cache: bool = Field(title="Hierarchical cache", default=True)
    hicache_size_gb: int = Field(
        title="Hierarchical cache size (GB)",
        default=DEFAULT_HICACHE_SIZE_GB,
        ge=0,
        description="--hicache-size",
    )
    num_continuous_decode_steps: int = Field(
        title="Continuous decode steps", default=DEFAULT_CONTINUOUS_DECODE_STEPS, ge=1
    )
    enable_metrics: bool = Field(
        title="Prometheus metrics",
        default=False,
        description="Launch with --enable-metrics (SGLang's /metrics). A run whose tiers use "
        "concurrency 'auto' turns it on, since the controller reads the server's load there.",
    )
    auto_concurrency: AutoConcurrency = Field(
        title="Auto concurrency",
        default_factory=lambda: AutoConcurrency(),
        description="How tiers with concurrency 'auto' are steered (server-wide).",
    )
    random_seed: int = Field(
        title="Random seed",
        default=0,
        ge=0,
        description="--random-seed. Fixed, because SGLang otherwise picks a random seed at every "
        "launch, so the same config would sample differently after each launch or relaunch.",
    )
    context_length: int | None = Field(
        title="Context length",
        default=None,
        description="--context-length; None takes the model's config.",
    )
    extra_args: list[str] = Field(
        title="Extra launch flags",
        default_factory=list,
        description="More launch_server flags, passed through verbatim.",
    )
    env: dict[str, str] = Field(
        title="Server environment",
        default_factory=dict,
        description='Environment for the server process, e.g. {"CUDA_VISIBLE_DEVICES": "0,1"}.',
    )
    api_key_env: str | None = Field(
        title="API key variable",
        default=None,
        description="Name of the environment variable holding SGLang's --api-key (never the key).",
    )
    api_key_secret: str | None = Field(
        title="API key Secret block",
        default=None,
        description="Name of a Prefect Secret block holding SGLang's --api-key (instead of "
        "api_key_env).",
    )
    startup_timeout_s: float = Field(
        title="Startup timeout (s)",
        default=3600.0,
        gt=0,
        description="Health-gate deadline; a 1T model loads for tens of minutes.",
    )
    max_requests_in_flight: int | None = Field(
        title="Max requests in flight (server)",
        default=None,
        ge=1,
        description="Server-wide cap on requests in flight across all partitions (None: the "
        "sum of the tiers' concurrency).",
    )
    max_tokens_in_flight: int | None = Field(
        title="Max tokens in flight (server)",
        default=None,
        ge=1,
        description="Server-wide cap on prompt + max_tokens summed over requests in flight, "
        "i.e. KV cache reserved; keeps a LONG tier from crowding out the others. None: no cap.",
    )
    lost_after_failures: int = Field(
        title="Failures before 'lost'",
        default=5,
        ge=1,
        description="Consecutive connection failures that mean 'server lost'.",
    )
    max_relaunches: int = Field(
        title="Max relaunches",
        default=2,
        ge=0,
        description="Launch mode: relaunches of a lost server before giving up.",
    )
    recovery_check_s: float = Field(
        title="Recovery wait (s)",
        default=60.0,
        gt=0,
        description="How long a lost server may take to answer again.",
    )
    request_timeout_s: float = Field(
        title="Request timeout (s)",
        default=1800.0,
        gt=0,
        description="Per-request timeout; a 16k-token generation takes minutes.",
    )

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


class Tier(_Model):
    """A concurrency class: how many requests are in flight and how long outputs may grow."""

    name: str = Field(
        title="Tier name", description="Tier name referenced by partitions, e.g. SHORT or LONG."
    )
    concurrency: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = Field(
        title="Concurrency",
        description="Requests in flight for a partition, or 'auto': the run steers the number "
        "in flight from the server's own load (SGLang's /metrics), shared fairly by the "
        "partitions on the server (server.auto_concurrency).",
    )
    max_tokens: int = Field(
        title="Max new tokens", ge=1, description="max_new_tokens for every request of the tier."
    )

    @property
    def is_auto(self) -> bool:
        return self.concurrency == "auto"

    @property
    def in_flight_cap(self) -> int:
        """The partition's own bound on requests in flight: its concurrency, or for 'auto' a
        ceiling the server-wide controller (sglang/concurrency.py) stays below."""
        return AUTO_PARTITION_CAP if self.concurrency == "auto" else self.concurrency


class Partition(_Model):
    """One prompts file and the tier it runs under."""

    name: str = Field(
        title="Partition name",
        description="Output sub-directory name; letters, digits, '_', '-', '.'.",
    )
    input: str = Field(
        title="Input file", description="Prompts file: JSONL (one prompt per line) or Parquet."
    )
    tier: str = Field(title="Tier", description="Name of a tier defined in `tiers`.")
    regenerate: Literal["last", "all_turns"] = Field(
        title="Turns to regenerate",
        default="last",
        description="'last': the last assistant turn, on the data's history. 'all_turns': every "
        "assistant turn in order, each on the model's own earlier turns (one record per turn; a "
        "conversation stops where the model's tool calls differ from the data's).",
    )
    samples: int = Field(
        title="Samples per prompt",
        default=1,
        ge=1,
        le=1024,
        description="Conversations generated per input line, each its own records (id suffix "
        "#s<n>, column sample).",
    )
    temperatures: list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] | None = Field(
        title="Temperatures",
        default=None,
        min_length=1,
        description="Cycled over the samples (sample n gets temperatures[n % len]); empty: "
        "sampling.temperature for every sample.",
    )

    def temperature(self, sample: int, default: float) -> float:
        """The temperature of sample ``sample``."""
        return self.temperatures[sample % len(self.temperatures)] if self.temperatures else default

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not _SAFE_NAME.match(v) or ".." in v:
            raise ValueError(
                f"partition name {v!r} is not a safe directory name "
                "(letters, digits, '_', '-', '.'; no slashes, no '..')"
            )
        return v


class ValidationPolicy(_Model):
    """How strictly outputs are checked before they become training data."""

    truncation: Literal["keep", "reject"] = Field(
        title="Truncated outputs",
        default="keep",
        description="'keep' stores length-truncated outputs, flagged; 'reject' rejects them.",
    )
    require_answer: bool = Field(
        title="Require an answer",
        default=True,
        description="Reject outputs with nothing after </think> (when not truncated).",
    )


class RetryPolicy(_Model):
    """Retries for transient failures: per request (transport errors, 429, 5xx, aborts), then
    per batch task (Prefect's task retries, once a request ran out of attempts)."""

    max_attempts: int = Field(
        title="Attempts per request",
        default=6,
        ge=1,
        le=100,
        description="Tries per request, first included.",
    )
    backoff_initial_s: float = Field(
        title="Initial backoff (s)", default=1.0, ge=0.0, description="First backoff; doubles."
    )
    backoff_max_s: float = Field(
        title="Max backoff (s)", default=60.0, ge=0.0, description="Backoff cap (jitter added)."
    )
    batch_retries: int = Field(
        default=2,
        ge=0,
        le=10,
        title="Batch task retries",
        description="Prefect retries of a failed batch task, after its requests' own attempts.",
    )
    batch_retry_delay_s: list[float] = Field(
        default_factory=lambda: [10.0, 60.0],
        min_length=1,
        title="Batch retry delays (s)",
        description="Wait before each batch retry; the last value repeats.",
    )


class ThroughputAlarm(_Model):
    """Warn while the run makes far fewer output tokens per second than the hardware should.

    Against ``expected_tok_s``, or without it against the rate the run measures in its first
    minutes (``probe_s``; 0 turns the alarm off). The seed's 225 tok/s against 930-1350 expected
    went unnoticed for a whole run; this turns such a dip into a warning, an event and an artifact.
    """

    expected_tok_s: float | None = Field(
        default=None,
        gt=0,
        title="Expected output tok/s",
        description="Output tokens per second the whole run should make (all partitions); "
        "empty: the run measures its own rate after the warm-up (probe_s) and alarms below that.",
    )
    alarm_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        title="Alarm ratio",
        description="Alarm when the windowed rate falls below expected x this ratio.",
    )
    warmup_s: float = Field(
        default=300.0,
        ge=0,
        title="Warm-up (s)",
        description="No alarm this long after generation starts (caches fill, slots ramp up).",
    )
    window_s: float = Field(
        default=120.0,
        gt=0,
        title="Window (s)",
        description="The rate is averaged over this trailing window.",
    )
    probe_s: float = Field(
        default=300.0,
        ge=0,
        title="Probe (s)",
        description="Without an expected rate: measure the run's own rate over this long after "
        "the warm-up and use it as the alarm's baseline; 0 turns the alarm off.",
    )


def _default_tiers() -> list[Tier]:
    return [
        Tier(name="SHORT", concurrency=150, max_tokens=10240),
        Tier(name="LONG", concurrency=32, max_tokens=16384),
    ]


class PipelineConfig(_Model):
    """Everything a run needs. Relative paths resolve against the config file's directory."""

    model: ModelSpec = Field(
        title="Model", description="The model whose tokenizer and chat template render prompts."
    )
    special_tokens: SpecialTokens = Field(title="Special tokens", default_factory=SpecialTokens)
    sampling: Sampling = Field(title="Sampling", default_factory=Sampling)
    server: ServerSpec = Field(title="SGLang server", default_factory=ServerSpec)
    tiers: list[Tier] = Field(title="Tiers", default_factory=_default_tiers, min_length=1)
    partitions: list[Partition] = Field(title="Partitions", min_length=1)
    validation: ValidationPolicy = Field(title="Validation", default_factory=ValidationPolicy)
    retries: RetryPolicy = Field(title="Retries", default_factory=RetryPolicy)
    throughput: ThroughputAlarm = Field(
        default_factory=ThroughputAlarm,
        title="Throughput alarm",
        description="Warn, emit an event and write an artifact when output tok/s stays low.",
    )
    output_dir: str = Field(
        title="Output directory",
        default="datagen-output",
        description="Run directory for the dataset.",
    )
    batch_size: Annotated[int, Field(ge=1, le=100_000)] = Field(
        title="Batch size",
        default=512,
        description="Prompts per Prefect task run (a task run costs ~10 ms).",
    )
    lock_wait_s: Annotated[float, Field(ge=0)] | None = Field(
        title="Wait for the output lock (s)",
        default=0.0,
        description="When another run is writing one of this run's partitions of the output "
        "directory: 0 refuses at once, naming it; a number waits that many seconds for it to "
        "finish; empty waits for as long as it takes.",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        tier_names = [t.name for t in self.tiers]
        dupes = {n for n in tier_names if tier_names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate tier names: {sorted(dupes)}")
        names = [p.name for p in self.partitions]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate partition names: {sorted(dupes)}")
        for p in self.partitions:
            if p.tier not in tier_names:
                raise ValueError(
                    f"partition {p.name!r} names tier {p.tier!r}, which is not in tiers "
                    f"{tier_names}"
                )
        return self

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    def partition(self, name: str) -> Partition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise ConfigError(
            f"unknown partition {name!r}; the config has {[p.name for p in self.partitions]}"
        )

    def resolve_paths(self, base: Path) -> PipelineConfig:
        """Make relative paths absolute against ``base`` (the config file's directory)."""

        def fix(value: str) -> str:
            p = Path(value).expanduser()
            if p.is_absolute():
                return str(p)
            candidate = base / p
            # Hub ids like "moonshotai/Kimi-K2.5" stay as they are unless they exist locally.
            return (
                str(candidate.resolve()) if candidate.exists() or value.startswith(".") else value
            )

        data = self.model_dump()
        data["model"]["path"] = fix(self.model.path)
        if self.model.tokenizer_path:
            data["model"]["tokenizer_path"] = fix(self.model.tokenizer_path)
        for part in data["partitions"]:
            part["input"] = str((base / Path(part["input"]).expanduser()).resolve())
        data["output_dir"] = str((base / Path(self.output_dir).expanduser()).resolve())
        return PipelineConfig.model_validate(data)


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: ``file: field.path: reason``."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "<root>"
        lines.append(f"{source}: {loc}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Load and validate a YAML config; relative paths resolve against the file's directory."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return parse_config(data, str(path)).resolve_paths(path.resolve().parent)
