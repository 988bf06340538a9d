"""What a run's partitions share while they run: the server's budget and supervisor, the meter;
and what one partition's run is given (:class:`PartitionJob`).

The parent flow passes one :class:`RunContext` to every partition subflow as a parameter, so a
partition uses exactly the live objects its run made (no registry to look them up in, nothing
to miss). Prefect records a subflow's parameters as JSON; this model's JSON form is a summary
of what the context holds (the objects themselves stay in the process), and that summary
validates back into a context: the same run key and server-wide limits, a fresh meter and no
supervisor (nothing watches a server for a partition rerun on its own), so a partition subflow
can be rerun from its own recorded parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, model_serializer, model_validator

from eagle3_datagen.config import PipelineConfig
from eagle3_datagen.report.throughput import RunMeter
from eagle3_datagen.sglang.budget import ServerBudget
from eagle3_datagen.sglang.supervisor import ServerSupervisor


class RunContext(BaseModel):
    """The live objects of one run, shared by its partitions (same process, same event loop)."""

    model_config = ConfigDict(frozen=True)

    run_key: str
    budget: InstanceOf[ServerBudget]
    # The run's one stop and lost-server watch (for a pool too); None for a standalone
    # partition run, which has no server session.
    supervisor: InstanceOf[ServerSupervisor] | None = None
    meter: InstanceOf[RunMeter] = Field(default_factory=RunMeter)

    @classmethod
    def standalone(cls, config: PipelineConfig, run_key: str = "standalone") -> RunContext:
        """For a partition run on its own: the config's server-wide limits, no supervisor."""
        server = config.server
        return cls(
            run_key=run_key,
            budget=ServerBudget(
                server.limits.max_requests_in_flight, server.limits.max_tokens_in_flight
            ),
        )

    @model_validator(mode="before")
    @classmethod
    def _from_summary(cls, data: Any) -> Any:
        """The recorded JSON form (see ``_summary``) back into live objects."""
        if isinstance(data, dict) and "budget" not in data and "run_key" in data:
            return {
                "run_key": data["run_key"],
                "budget": ServerBudget(
                    data.get("max_requests_in_flight"), data.get("max_tokens_in_flight")
                ),
            }
        return data

    @model_serializer
    def _summary(self) -> dict[str, Any]:
        """The JSON form Prefect records for the subflow parameter: what, not the objects."""
        return {
            "run_key": self.run_key,
            "supervised": self.supervisor is not None,
            "max_requests_in_flight": self.budget.max_requests,
            "max_tokens_in_flight": self.budget.max_tokens,
        }


@dataclass(frozen=True, slots=True)
class PartitionJob:
    """One partition's run, as the partition subflow's parameters give it: the config, which
    partition, the server (its URL and the limits its pre-flight found), the Parquet metadata,
    and the run it belongs to (None: a partition run on its own)."""

    config: PipelineConfig
    partition: str
    server_url: str
    context_length: int | None = None
    max_req_input_len: int | None = None
    parquet_metadata: dict[str, str] | None = None
    run: RunContext | None = None
