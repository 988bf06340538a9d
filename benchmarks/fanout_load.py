"""What a fan-out costs the Prefect server and its database, per partition job and per batch.

    uv run python benchmarks/fanout_load.py [--partitions 4] [--json PATH]

A Prefect server on PostgreSQL (a throwaway cluster, as in tests/e2e/test_prefect_restart.py),
two process workers standing in for two GPU pods' nodes (``--limit 1``, the default 10 s poll),
and the fan-out of docs/scaling.md (``eagle3-datagen run CONFIG --fan-out``) over the bundled
emulator.
Two fan-outs with the same number of partitions, one with 2 batches per partition and one with
6, separate what a partition job costs from what a batch costs. Counted for each fan-out:

- HTTP requests to the API, by route, from the server's own access log (uvicorn, at INFO);
- rows written to each Postgres table (``pg_stat_user_tables``), the database's growth;
- artifacts, logs and events, through the REST API.

docs/scale-plan.md reports a run of this script and scales it to 64 partitions. The numbers
are counts, not timings, so a loaded machine changes them little (polls are the exception: they
scale with how long the fan-out runs, reported per second of run time).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import REPO, TOKENIZER_DIR, free_port, stop_process
from tests.support.postgres import Postgres, running_postgres
from tests.support.prefect import PrefectServer
from tests.support.prompts import write_prompts

ACCESS = re.compile(r'"(GET|POST|PATCH|PUT|DELETE) (/api/[^ ?"]*)[^"]*" (\d{3})')
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@contextlib.contextmanager
def server_on(pg: Postgres) -> Iterator[PrefectServer]:
    """``prefect server start`` on ``pg``, with uvicorn's access log (the server at INFO)."""
    home = Path(tempfile.mkdtemp(prefix="fanout-load-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_EXTRA_LOGGERS="eagle3_datagen",
        TRANSFORMERS_VERBOSITY="error",
    )
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    server_env = dict(
        env, PREFECT_API_DATABASE_CONNECTION_URL=pg.url, PREFECT_SERVER_LOGGING_LEVEL="INFO"
    )
    srv = PrefectServer(
        api=api, env=dict(env, PREFECT_API_URL=api), home=home, port=port, server_env=server_env
    )
    try:
        srv.start_server(timeout=600)
        yield srv
        for proc in reversed(srv.procs):
            stop_process(proc, 20)
    finally:
        srv.stop_server()


def table_writes(pg: Postgres) -> dict[str, int]:
    """Rows inserted + updated per table since the cluster started, and the database size."""
    sql = (
        "select relname, n_tup_ins + n_tup_upd from pg_stat_user_tables "
        "union all select '_db_bytes', pg_database_size(current_database())"
    )
    out = subprocess.run(
        [
            str(pg.bindir / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(pg.port),
            "-U",
            "prefect",
            "-d",
            "prefect",
            "-At",
            "-F",
            "\t",
            "-c",
            sql,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return {name: int(n) for name, n in (line.split("\t") for line in out.splitlines())}


def requests_by_route(log: Path, offset: int) -> tuple[collections.Counter[str], int]:
    """Access-log requests after byte ``offset``, by method and route (ids as {id})."""
    data = log.read_bytes()
    routes: collections.Counter[str] = collections.Counter()
    for match in ACCESS.finditer(data[offset:].decode("utf-8", "replace")):
        routes[f"{match.group(1)} {UUID.sub('{id}', match.group(2))}"] += 1
    return routes, len(data)


def write_config(tmp: Path, name: str, partitions: int, batches: int) -> Path:
    per_batch = 8
    data: dict[str, Any] = {
        "model": {"path": str(TOKENIZER_DIR)},
        "server": {
            "mode": "launch",
            "engine": "emulator",
            "port": 0,
            "startup_timeout_s": 120,
            "extra_args": ["--emu-running-slots", "8", "--emu-decode-ms-per-token", "2"],
        },
        "tiers": [{"name": "SHORT", "concurrency": 8, "max_tokens": 1024}],
        "partitions": [
            {
                "name": f"p{i:02d}",
                "tier": "SHORT",
                "input": str(
                    write_prompts(tmp / f"{name}-p{i}.jsonl", batches * per_batch, first=i * 1000)
                ),
            }
            for i in range(partitions)
        ],
        "output_dir": str(tmp / f"{name}-out"),
        "batch_size": per_batch,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fan_out(srv: PrefectServer, pg: Postgres, config: Path, offset: int) -> dict[str, Any]:
    """One fan-out through the CLI; what it cost the API and the database."""
    before = table_writes(pg)
    artifacts_before = len(srv.post("/artifacts/filter", {"limit": 200}))
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "eagle3_datagen_cli.main", "run", str(config), "--fan-out"],
        cwd=REPO,
        env=srv.env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if run.returncode != 0:
        raise RuntimeError(run.stdout[-2000:] + run.stderr[-4000:])
    elapsed = time.monotonic() - started
    time.sleep(12)  # let the last batched logs and events land
    after = table_writes(pg)
    routes, end = requests_by_route(srv.home / "server.log", offset)
    rows = {t: after[t] - before.get(t, 0) for t in after if after[t] != before.get(t, 0)}
    return {
        "seconds": round(elapsed, 1),
        "requests": sum(routes.values()),
        "routes": dict(routes.most_common()),
        "rows": rows,
        "artifacts": len(srv.post("/artifacts/filter", {"limit": 200})) - artifacts_before,
        "log_end": end,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="fanout-load-data-"))
    with running_postgres() as pg, server_on(pg) as srv:
        for pool in ("gpu-process", "cpu-process"):
            srv.cli("work-pool", "create", pool, "--type", "process")
        srv.cli(
            "--no-prompt",
            "deploy",
            "--name",
            "partition-job",
            "--prefect-file",
            "deployments/prefect.yaml",
            timeout=600,
        )
        for name in ("node-a", "node-b"):
            srv.start(
                "worker",
                "start",
                "--pool",
                "gpu-process",
                "--name",
                name,
                "--limit",
                "1",
                log=tmp / f"{name}.log",
            )
        time.sleep(30)
        _, offset = requests_by_route(srv.home / "server.log", 0)
        idle_start, before_idle = time.monotonic(), offset
        time.sleep(60)  # two idle workers: the poll load with nothing to do
        idle, offset = requests_by_route(srv.home / "server.log", before_idle)
        results: dict[str, Any] = {
            "partitions": args.partitions,
            "idle_requests_per_s": round(sum(idle.values()) / (time.monotonic() - idle_start), 2),
            "idle_routes": dict(idle),
        }
        for name, batches in (("small", 2), ("large", 6)):
            config = write_config(tmp, name, args.partitions, batches)
            results[name] = {"batches_per_partition": batches, **fan_out(srv, pg, config, offset)}
            offset = results[name].pop("log_end")
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
