"""Check, at image build time, that one Python runs the pipeline and (GPU image) SGLang.

    python docker/check_env.py            # CPU image: the project and its flows import
    python docker/check_env.py --sglang   # GPU image: SGLang too, and nothing we installed
                                          # breaks one of SGLang's version pins

The pipeline launches ``python -m sglang.launch_server`` with its own interpreter, so both must
import from one environment. In the GPU image that is a venv with --system-site-packages over
the SGLang image's Python; a locked package in the venv shadows the image's copy, and if
SGLang pins that package to another version the server may break only once a GPU run starts.
This script turns that into a build failure that names the package.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import sys
from pathlib import Path

from packaging.requirements import Requirement

PROJECT = "eagle3-datagen"
MODULES = [
    "eagle3_datagen",
    "sglang_emulator",
    "eagle3_datagen_flows.pipeline",
    "eagle3_datagen_tasks.batch",
    "eagle3_datagen_cli.main",
]


def unmet_requirements(requirer: str) -> list[tuple[Requirement, str, Path]]:
    """``requirer``'s base requirements that the distribution Python would import does not meet.

    Each item is (requirement, installed version, site directory). Requirements of extras and
    packages not installed at all are skipped: only version clashes matter here.
    """
    unmet = []
    for line in md.requires(requirer) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            dist = md.distribution(req.name)  # the first on sys.path, i.e. what gets imported
        except md.PackageNotFoundError:
            continue
        if not req.specifier.contains(dist.version, prereleases=True):
            unmet.append((req, dist.version, Path(str(dist.locate_file(""))).resolve()))
    return unmet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang", action="store_true", help="also require SGLang (GPU image)")
    args = parser.parse_args(argv)

    for module in MODULES + (["sglang"] if args.sglang else []):
        importlib.import_module(module)

    names = [PROJECT, "prefect", "transformers", "tokenizers", "sglang", "torch"]
    versions = {n: md.version(n) for n in names if _installed(n)}
    print(f"python {sys.version.split()[0]} ({sys.executable}): {versions}")

    venv = Path(sys.prefix).resolve()
    failed = False
    if args.sglang:
        for req, version, where in unmet_requirements("sglang"):
            if where.is_relative_to(venv):  # we put it there; the image's own quirks are not ours
                failed = True
                print(
                    f"ERROR: {req.name} {version} from uv.lock shadows the image's copy, but "
                    f"SGLang requires {req}; add {req.name} to SGLANG_OWNS in docker/Dockerfile "
                    "or move the lock to a version SGLang accepts",
                    file=sys.stderr,
                )
    for req, version, where in unmet_requirements(PROJECT):
        # Expected for SGLANG_OWNS packages in the GPU image; shown so the build log says so.
        print(f"note: {PROJECT} pins {req}, this image has {version} ({where})")
    return 1 if failed else 0


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
