"""Pipeline configuration: one pydantic model, loaded from YAML, that is also the flow parameter.

The same :class:`PipelineConfig` is what ``eagle3-datagen run CONFIG.yaml`` loads and what the
Prefect UI renders as the run form, so every field carries a title-worthy description, tiers and
partitions are lists of models (editable with "Add item"), and choices are ``Literal`` dropdowns.

One module per part of the YAML: ``model`` (model and special tokens), ``sampling``, ``server``,
``partitions`` (tiers and partitions), ``policies`` (validation, retries, throughput alarm),
``profile`` (the serving profile coverage compares with),
``pipeline`` (the whole config), ``loading`` (from YAML, with clear errors), and ``reference``
(docs/config.md, generated from these models). Import the names from here.
"""

from __future__ import annotations

from eagle3_datagen.config.loading import format_validation_error, load_config, parse_config
from eagle3_datagen.config.model import ModelSpec, SpecialTokens, ToolCallTokens
from eagle3_datagen.config.partitions import (
    AUTO_PARTITION_CAP,
    Logprobs,
    NearDuplicates,
    Partition,
    Tier,
)
from eagle3_datagen.config.pipeline import PipelineConfig
from eagle3_datagen.config.policies import RetryPolicy, ThroughputAlarm, ValidationPolicy
from eagle3_datagen.config.profile import SCRIPTS, ServingProfile, parse_bucket
from eagle3_datagen.config.sampling import Sampling
from eagle3_datagen.config.server import (
    DEFAULT_CONTINUOUS_DECODE_STEPS,
    DEFAULT_HICACHE_SIZE_GB,
    DEFAULT_MEM_FRACTION,
    DEFAULT_PORT,
    DEFAULT_TP_SIZE,
    REASONING_PARSER_FLAG,
    AutoConcurrency,
    LaunchFlags,
    Recovery,
    ServerLimits,
    ServerSpec,
    SpeculativeSpec,
    names_reasoning_parser,
)
from eagle3_datagen.errors import ConfigError

__all__ = [
    "AUTO_PARTITION_CAP",
    "DEFAULT_CONTINUOUS_DECODE_STEPS",
    "DEFAULT_HICACHE_SIZE_GB",
    "DEFAULT_MEM_FRACTION",
    "DEFAULT_PORT",
    "DEFAULT_TP_SIZE",
    "REASONING_PARSER_FLAG",
    "SCRIPTS",
    "AutoConcurrency",
    "ConfigError",
    "LaunchFlags",
    "Logprobs",
    "ModelSpec",
    "NearDuplicates",
    "Partition",
    "PipelineConfig",
    "Recovery",
    "RetryPolicy",
    "Sampling",
    "ServerLimits",
    "ServerSpec",
    "ServingProfile",
    "SpecialTokens",
    "SpeculativeSpec",
    "ThroughputAlarm",
    "Tier",
    "ToolCallTokens",
    "ValidationPolicy",
    "format_validation_error",
    "load_config",
    "names_reasoning_parser",
    "parse_bucket",
    "parse_config",
]
