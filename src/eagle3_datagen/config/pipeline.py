"""The whole config: every section, and the checks that span sections."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails

from eagle3_datagen.config.base import StrictModel
from eagle3_datagen.config.model import ModelSpec, SpecialTokens
from eagle3_datagen.config.partitions import Partition, Tier
from eagle3_datagen.config.policies import RetryPolicy, ThroughputAlarm, ValidationPolicy
from eagle3_datagen.config.profile import ServingProfile
from eagle3_datagen.config.sampling import Sampling
from eagle3_datagen.config.server import ServerSpec
from eagle3_datagen.errors import ConfigError


def _default_tiers() -> list[Tier]:
    return [
        Tier(name="SHORT", concurrency=150, max_tokens=10240),
        Tier(name="LONG", concurrency=32, max_tokens=16384),
    ]


class PipelineConfig(StrictModel):
    """Everything a run needs. Relative paths resolve against the config file's directory."""

    model: ModelSpec = Field(title="Model")
    """The model whose tokenizer and chat template render prompts."""
    special_tokens: SpecialTokens = Field(title="Special tokens", default_factory=SpecialTokens)
    sampling: Sampling = Field(title="Sampling", default_factory=Sampling)
    server: ServerSpec = Field(title="SGLang server", default_factory=ServerSpec)
    tiers: list[Tier] = Field(title="Tiers", default_factory=_default_tiers, min_length=1)
    partitions: list[Partition] = Field(title="Partitions", min_length=1)
    validation: ValidationPolicy = Field(title="Validation", default_factory=ValidationPolicy)
    retries: RetryPolicy = Field(title="Retries", default_factory=RetryPolicy)
    throughput: ThroughputAlarm = Field(default_factory=ThroughputAlarm, title="Throughput alarm")
    """Warn, emit an event and write an artifact when output tok/s stays low."""
    serving_profile: ServingProfile | None = Field(default=None, title="Serving profile")
    """The traffic the draft will serve; `eagle3-datagen coverage` and the dataset card compare the
    data with it (docs/coverage.md). Empty: they show the data's own mix."""
    output_dir: str = Field(title="Output directory", default="datagen-output")
    """Run directory for the dataset."""
    batch_size: Annotated[int, Field(ge=1, le=100_000)] = Field(title="Batch size", default=512)
    """Prompts per Prefect task run (a task run costs ~10 ms)."""
    lock_wait_s: Annotated[float, Field(ge=0)] | None = Field(
        title="Wait for the output lock (s)", default=0.0
    )
    """When another run is writing one of this run's partitions of the output directory: 0 refuses
    at once, naming it; a number waits that many seconds for it to finish; empty waits for as long
    as it takes."""

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
        self._declared_modes()
        for p in self.partitions:
            if p.tier not in tier_names:
                raise ValueError(
                    f"partition {p.name!r} names tier {p.tier!r}, which is not in tiers "
                    f"{tier_names}"
                )
        return self

    def _declared_modes(self) -> None:
        """Every mode a partition mixes is declared in model.modes; the error is located at
        the partition's mode, so the loader names its YAML line."""
        declared = ", ".join(sorted(self.model.modes)) or "none"
        errors = [
            InitErrorDetails(
                type="value_error",
                loc=("partitions", i, "modes", name),
                input=name,
                ctx={
                    "error": ValueError(
                        f"mode {name!r} is not declared in model.modes (declared: {declared})"
                    )
                },
            )
            for i, p in enumerate(self.partitions)
            for name in p.modes or {}
            if name not in self.model.modes
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)

    def tier(self, name: str) -> Tier:
        return next(t for t in self.tiers if t.name == name)

    def partition(self, name: str) -> Partition:
        for p in self.partitions:
            if p.name == name:
                return p
        raise ConfigError(
            f"unknown partition {name!r}; the config has {[p.name for p in self.partitions]}"
        )

    def select(self, names: Sequence[str] | None) -> list[Partition]:
        """The partitions ``names`` selects, in that order (None or empty: all of them); an
        unknown name is a ConfigError, raised before anything starts."""
        return [self.partition(name) for name in names] if names else list(self.partitions)

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
