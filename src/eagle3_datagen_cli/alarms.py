"""The Prefect automations the command line installs (``eagle3-datagen alarm``).

``alarm install --block NAME`` creates the automations of ``flows/automations/`` (throughput
low, run failed; package data of ``eagle3_datagen_flows``, next to the flows that emit the
events they match, so they are there after ``pip install .``) with a named notification block,
so no placeholder id ever reaches the server. ``alarm unschedulable`` creates the two that fail
a run whose Kubernetes pod stays unschedulable.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from uuid import UUID

import yaml
from prefect.client.orchestration import PrefectClient, get_client
from prefect.events.schemas.automations import AutomationCore

from eagle3_datagen.errors import ConfigError

# Package data: the file installs with this package, so `alarm install` works from a wheel too.
ALARM_FILE = Path(str(resources.files("eagle3_datagen_flows") / "automations/throughput-low.yaml"))
# Every shipped automation: `alarm install` installs them all with the one block.
ALARM_FILES = [ALARM_FILE, ALARM_FILE.with_name("run-failed.yaml")]
# Kubernetes pools: a run whose pod is unschedulable goes to Unschedulable, then Failed.
UNSCHEDULABLE_FILES = [
    ALARM_FILE.with_name("pod-unschedulable.yaml"),
    ALARM_FILE.with_name("pod-unschedulable-failed.yaml"),
]
# How long a run may stay Unschedulable before it is failed (pod-unschedulable-failed.yaml says
# why 30 min); `alarm unschedulable --minutes` changes it.
UNSCHEDULABLE_MINUTES = 30.0


def automation_spec(path: Path, block_id: UUID) -> AutomationCore:
    """The automation file with the notification block's id in every send-notification."""
    spec = yaml.safe_load(path.read_text())
    for action in spec.get("actions", []):
        if action.get("type") == "send-notification":
            action["block_document_id"] = str(block_id)
    return AutomationCore.model_validate(spec)


async def _block_id(client: PrefectClient, block: str) -> tuple[UUID, str]:
    """A notification block by ``NAME`` or ``TYPE-SLUG/NAME`` (as ``prefect block ls`` shows)."""
    slug, _, name = block.rpartition("/")
    documents = [
        d
        for d in await client.read_block_documents()
        if d.name == name and (not slug or (d.block_type and d.block_type.slug == slug))
    ]
    if not documents:
        raise ConfigError(
            f"no block named {block!r} on this Prefect server; make one first (UI: Blocks > +, "
            "e.g. Slack Webhook), then pass its name (`prefect block ls`)"
        )
    if len(documents) > 1:
        kinds = sorted(f"{d.block_type.slug}/{d.name}" for d in documents if d.block_type)
        raise ConfigError(f"several blocks are named {name!r}: say which, one of {kinds}")
    doc = documents[0]
    kind = doc.block_type.slug if doc.block_type else "?"
    if doc.block_schema is not None and "notify" not in doc.block_schema.capabilities:
        raise ConfigError(f"block {kind}/{name} cannot send notifications")
    return doc.id, f"{kind}/{doc.name}"


async def _upsert(client: PrefectClient, automation: AutomationCore) -> tuple[str, UUID]:
    """Create the automation, or update the one of that name; ("created"|"updated", id)."""
    existing = await client.read_automations_by_name(automation.name)
    if existing:
        await client.update_automation(existing[0].id, automation)
        return "updated", existing[0].id
    return "created", await client.create_automation(automation)


def unschedulable_specs(minutes: float) -> list[AutomationCore]:
    """The two unschedulable-pod automations, the proactive one waiting ``minutes``."""
    if minutes * 60 < 10:
        raise ConfigError(f"--minutes {minutes}: Prefect waits at least 10 s (0.17 min)")
    specs = []
    for path in UNSCHEDULABLE_FILES:
        spec = yaml.safe_load(path.read_text())
        if spec["trigger"]["posture"] == "Proactive":
            spec["trigger"]["within"] = minutes * 60
        specs.append(AutomationCore.model_validate(spec))
    return specs


async def install_unschedulable(minutes: float = UNSCHEDULABLE_MINUTES) -> str:
    """Create (or update, by name) the unschedulable-pod automations; one line per automation."""
    lines = []
    async with get_client() as client:
        for automation in unschedulable_specs(minutes):
            done, automation_id = await _upsert(client, automation)
            lines.append(f"automation {automation.name!r} ({automation_id}) {done}")
    return "\n".join(lines) + f"\nruns whose pod stays unschedulable fail after {minutes:g} min"


async def install_alarms(block: str, paths: list[Path]) -> str:
    """Create (or update, by name) each automation file's automation with ``block``; one line
    per automation saying what was done."""
    return "\n".join([await install_alarm(block, path) for path in paths])


async def install_alarm(block: str, path: Path = ALARM_FILE) -> str:
    """Create (or update, by name) the file's automation with ``block``; says what it did."""
    async with get_client() as client:
        block_id, block_name = await _block_id(client, block)
        automation = automation_spec(path, block_id)
        done, automation_id = await _upsert(client, automation)
    return f"automation {automation.name!r} ({automation_id}) {done}: notifies through {block_name}"
