"""The Dockerfile stays in step with pyproject.toml, the Makefile and the Kubernetes manifests.

No container runtime is needed: the image is read as the files that define it, so a new
package, a Python upgrade or a changed port that one of them misses fails here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES = ROOT / "ops" / "deploy" / "kubernetes"


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` per Dockerfile instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    parsed = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            parsed.append((keyword.upper(), " ".join(rest.split())))
    return parsed


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def stages(dockerfile: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, arguments in dockerfile:
        if keyword == "FROM":
            found.append([])
        found[-1].append((keyword, arguments))
    return found


def manifest(name: str) -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / name).read_text(encoding="utf-8"))


def gateway_container() -> dict[str, Any]:
    deployment = next(
        document
        for document in yaml.safe_load_all((KUBERNETES / "gateway.yaml").read_text())
        if document and document.get("kind") == "Deployment"
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_both_stages_use_the_python_the_project_requires(
    dockerfile: list[tuple[str, str]], pyproject: dict[str, Any]
) -> None:
    required = pyproject["project"]["requires-python"]
    lowest = re.search(r">=\s*(\d+\.\d+)", required).group(1)
    bases = [arguments.split()[0] for keyword, arguments in dockerfile if keyword == "FROM"]
    assert len(bases) == 2, "a build stage and a runtime stage"
    for base in bases:
        assert base.startswith(f"python:{lowest}-"), f"{base} does not match {required}"


def test_every_installed_package_is_copied_into_the_build(
    dockerfile: list[tuple[str, str]], pyproject: dict[str, Any]
) -> None:
    included = [
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    ]
    copied = {
        arguments.split()[0]
        for keyword, arguments in stages(dockerfile)[0]
        if keyword == "COPY" and not arguments.startswith("--from")
    }
    for package in included:
        assert (ROOT / package / "__init__.py").is_file(), f"{package} is not a package"
        assert package in copied, f"the Dockerfile does not copy the package {package!r}"
    on_disk = {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in ("tests", "benchmarks")
    }
    assert on_disk == set(included), "pyproject's package list and the source tree differ"
    assert {"pyproject.toml", "uv.lock", "Makefile"} <= {
        name for _, arguments in stages(dockerfile)[0] for name in arguments.split()
    }


def test_the_build_runs_make_install_without_the_test_tools(
    dockerfile: list[tuple[str, str]],
) -> None:
    runs = [arguments for keyword, arguments in stages(dockerfile)[0] if keyword == "RUN"]
    install = [command for command in runs if "make install" in command]
    # No extras: the locked dependencies without the test and docs tools.
    assert install and re.search(r"\bINSTALL_EXTRAS=(\s|$)", install[0])
    assert not any("pip install" in command for command in runs), "install goes through make"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "sync --locked --quiet $(if $(COMPILE_ALL),--compile-bytecode)" in makefile
    assert "COMPILE_ALL := $(filter all,$(BYTECODE))" in makefile
    # The whole venv is compiled and its bytecode stays in the image: its user cannot write
    # bytecode, so a pod would otherwise compile TensorFlow from source as it starts.
    assert re.search(r"\bBYTECODE=all\b", install[0])
    assert not any("__pycache__" in command for command in runs)
    assert re.search(r"^INSTALL_EXTRAS \?= dev docs$", makefile, re.M)


def test_the_runtime_stage_runs_the_cli_as_an_unprivileged_user(
    dockerfile: list[tuple[str, str]], pyproject: dict[str, Any]
) -> None:
    runtime = stages(dockerfile)[1]
    (user,) = [arguments for keyword, arguments in runtime if keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    (entrypoint,) = [arguments for keyword, arguments in runtime if keyword == "ENTRYPOINT"]
    assert entrypoint == f'["{next(iter(pyproject["project"]["scripts"]))}"]'
    security = gateway_container()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert (security["runAsUser"], security["runAsGroup"]) == (int(uid), int(gid))


def test_the_manifests_run_the_image_make_builds_on_the_ports_it_exposes(
    dockerfile: list[tuple[str, str]],
) -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    tag = re.search(r"docker build -t (\S+) \.", makefile).group(1)
    container = gateway_container()
    assert container["image"] == tag
    tfjob = manifest("tfjob.yaml")
    workers = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert {c["image"] for c in workers} == {tag}
    exposed = {
        int(port)
        for keyword, arguments in stages(dockerfile)[1]
        if keyword == "EXPOSE"
        for port in arguments.split()
    }
    assert exposed == {port["containerPort"] for port in container["ports"]}


def test_the_build_context_leaves_out_local_state() -> None:
    ignored = set((ROOT / ".dockerignore").read_text(encoding="utf-8").split())
    assert {".git", ".venv", "out", "runs", "models"} <= ignored
