"""deployments/kubernetes/: the Job a Kubernetes worker would create for a partition job, rendered
by prefect-kubernetes's own code and validated against the Kubernetes API schema.

On Prefect's real local backend: the work pools are created with the repository's base job
templates (the server validates them), the deployments with the job variables of
``deployments/kubernetes/prefect.yaml``, and the flow runs the way the fan-out starts them
(``run_deployment`` with one partition). ``KubernetesWorkerJobConfiguration.resolve_for_flow_run``
is what the worker calls for each run it picks up (``from_template_and_values`` then
``prepare_for_flow_run``); its ``job_manifest`` is the body of the Job it creates. That body is
validated strictly (unknown fields are errors) against the Kubernetes 1.33 OpenAPI schema that
the ``kubernetes-validate`` package ships, and compared with the recorded fixture in
``tests/fixtures/kubernetes/`` (ids and the API URL replaced by placeholders). To re-record
after an intended change, run this file with ``EAGLE3_RECORD_K8S_FIXTURES=1``.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prefect import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.deployments.flow_runs import arun_deployment
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

from eagle3_datagen_flows.deploy_params import config_parameters
from eagle3_datagen_flows.fanout import datagen_fanout
from eagle3_datagen_flows.pipeline import datagen
from tests.support import REPO

pytestmark = pytest.mark.usefixtures("prefect_backend")

K8S = REPO / "deployments" / "kubernetes"
FIXTURES = REPO / "tests" / "fixtures" / "kubernetes"
KIMI = REPO / "configs" / "kimi-k2.5.yaml"
# A version GPU clusters run today; the schema is the one kubernetes-validate ships for it.
K8S_VERSION = "1.33.0"
# prefect-kubernetes (0.8.0) requires these two Job fields inside the *pod* spec, where the
# Kubernetes API does not define them (the API server drops them with a warning).
PREFECT_POD_SPEC_EXTRAS = {"parallelism": 1, "completions": 1}


def _template(name: str) -> dict[str, Any]:
    return dict(json.loads((K8S / name).read_text()))


def _deployments() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((K8S / "prefect.yaml").read_text())
    return {d["name"]: {**d, "pull": spec["pull"]} for d in spec["deployments"]}


async def _rendered(
    pool_name: str, template: str, deployment: str, flow: Any, parameters: dict[str, Any], run: str
) -> dict[str, Any]:
    """The Job manifest the Kubernetes worker would create for a new run of ``deployment``."""
    spec = _deployments()[deployment]
    async with get_client() as client:
        pool = await client.create_work_pool(
            WorkPoolCreate(name=pool_name, type="kubernetes", base_job_template=_template(template))
        )
        flow_id = await client.create_flow(flow)
        deployment_id = await client.create_deployment(
            flow_id=flow_id,
            name=deployment,
            work_pool_name=pool_name,
            entrypoint=spec["entrypoint"],
            job_variables=spec["work_pool"]["job_variables"],
            pull_steps=spec["pull"],
            parameters={k: v for k, v in spec.get("parameters", {}).items() if k != "config"},
        )
        flow_run = await arun_deployment(
            name=f"{flow.name}/{deployment}", parameters=parameters, flow_run_name=run, timeout=0
        )
        configuration = await KubernetesWorkerJobConfiguration.resolve_for_flow_run(
            flow_run,
            client=client,
            work_pool=pool,
            worker_name="k8s-worker",
            deployment=await client.read_deployment(deployment_id),
        )
        manifest = copy.deepcopy(configuration.job_manifest)
        ids = {
            str(flow_run.id): "<flow-run-id>",
            str(flow_id): "<flow-id>",
            str(deployment_id): "<deployment-id>",
            str(pool.id): "<work-pool-id>",
        }
    return _placeholders(manifest, ids)


def _placeholders(manifest: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """Run ids and the test server's address out, so the fixture holds what a cluster gets."""
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    env = []
    for var in container["env"]:
        if var["name"].startswith("PREFECT_SERVER_"):  # the test harness's own server settings
            continue
        if var["name"] == "PREFECT_HOME":  # the test session's own (tests/conftest.py)
            continue
        if var["name"] == "PREFECT_API_URL":
            var = {**var, "value": "<PREFECT_API_URL>"}
        env.append(var)
    container["env"] = env
    for labels in (
        manifest["metadata"]["labels"],
        manifest["spec"]["template"]["metadata"]["labels"],
    ):
        labels["prefect.io/deployment-updated"] = "<deployment-updated>"
    text = json.dumps(manifest)
    for value, placeholder in ids.items():
        text = text.replace(value, placeholder)
    return dict(json.loads(text))


def _validate_strictly(manifest: dict[str, Any]) -> None:
    """The Kubernetes schema, unknown fields included, less the two fields the worker forces."""
    body = copy.deepcopy(manifest)
    pod = body["spec"]["template"]["spec"]
    for key, value in PREFECT_POD_SPEC_EXTRAS.items():
        assert pod.pop(key) == value, f"the worker no longer puts {key} in the pod spec"
    kubernetes_validate.validate(body, K8S_VERSION, strict=True)


def _check_fixture(name: str, manifest: dict[str, Any]) -> None:
    path = FIXTURES / name
    if os.environ.get("EAGLE3_RECORD_K8S_FIXTURES"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=2) + "\n")
    recorded = json.loads(path.read_text())
    assert manifest == recorded, f"{path} differs from the rendered Job (re-record it if intended)"


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["value"] for v in container["env"]}


async def test_partition_job_renders_to_a_valid_gpu_job() -> None:
    params = config_parameters(str(KIMI))  # the fan-out's parameters for one partition
    manifest = await _rendered(
        "gpu-kubernetes",
        "gpu-job-template.json",
        "partition-job-k8s",
        datagen,
        {**params, "partitions": ["B1_glaive"], "overwrite": False},
        "partition-job-B1_glaive",
    )
    _validate_strictly(manifest)
    _check_fixture("partition-job-k8s.json", manifest)

    job = manifest["spec"]
    pod = job["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == params["config"]["server"]["launch"]["tp_size"]
    )
    # The image's ENTRYPOINT is `prefect worker start`: the container command must replace it,
    # or the worker's args would become arguments of a worker.
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["prefect", "worker", "start"]' in dockerfile
    assert container["command"] == ["/usr/bin/env", "--"]
    assert container["args"] == ["prefect", "flow-run", "execute"]
    assert container["image"] == _compose_image("gpu-worker")

    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    config = params["config"]
    # The config's paths are on the volumes: the model read-only, the outputs writable.
    assert Path(config["model"]["path"]).is_relative_to("/shared") and mounts["/shared"]["readOnly"]
    assert Path(config["output_dir"]).is_relative_to("/data") and not mounts["/data"].get(
        "readOnly"
    )
    assert all(p["input"].startswith("/data/") for p in config["partitions"])

    # Prefect owns retries (backoffLimit 0): on SIGTERM (eviction, preemption) the supervisor
    # puts the run back to Scheduled, and a new pod resumes it from the journal on /data.
    assert job["backoffLimit"] == 0
    assert _env(container)["PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"] == "reschedule"
    assert job["activeDeadlineSeconds"] > config["server"]["limits"]["startup_timeout_s"]
    assert pod["restartPolicy"] == "Never"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert _env(container)["PREFECT__FLOW_RUN_ID"] == "<flow-run-id>"


async def test_fanout_parent_renders_to_a_small_cpu_job() -> None:
    params = config_parameters(str(KIMI))
    deployment = _deployments()["kimi-k2.5-fanout-k8s"]
    assert deployment["parameters"]["deployment"] == "eagle3-datagen/partition-job-k8s"
    manifest = await _rendered(
        "cpu-kubernetes",
        "cpu-job-template.json",
        "kimi-k2.5-fanout-k8s",
        datagen_fanout,
        {**params, "deployment": deployment["parameters"]["deployment"]},
        "fanout-k8s",
    )
    _validate_strictly(manifest)
    _check_fixture("kimi-k2.5-fanout-k8s.json", manifest)
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert container["image"] == _compose_image("cpu-worker")
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/data"]  # reads the outputs
    assert "activeDeadlineSeconds" not in manifest["spec"]  # it waits for every wave of pods


def test_templates_keep_every_worker_variable() -> None:
    """Every variable the worker's own default template defines is still ours to set."""
    default = KubernetesWorker.get_default_base_job_template()["variables"]["properties"]
    for name in ("gpu-job-template.json", "cpu-job-template.json"):
        template = _template(name)
        assert set(default) <= set(template["variables"]["properties"]), name
        placeholders = set(re.findall(r"\{\{ *(\w+) *\}\}", json.dumps(template)))
        assert placeholders <= set(template["variables"]["properties"]), name


def test_the_strict_check_catches_a_misplaced_field() -> None:
    manifest = json.loads((FIXTURES / "partition-job-k8s.json").read_text())
    manifest["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate_strictly(manifest)


def _compose_image(service: str) -> str:
    """The image docker/compose.yaml builds for ``service``, its default name."""
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    image = compose["services"][service]["image"]
    match = re.fullmatch(r"\$\{\w+:-([^}]+)\}", image)
    assert match, image
    return match.group(1)
