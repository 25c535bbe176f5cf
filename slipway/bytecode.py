"""Write the bytecode of every module Slipway's processes import, once, at install time.

``uv sync`` installs sources only. Compiling all of them (``--compile-bytecode``, some
14,000 files) takes about a minute, most of it for modules no Slipway process ever
imports. Importing each of the project's own modules instead compiles exactly what they
pull in (TensorFlow, Keras, Beam, tfmot, gRPC: about 5,000 files) in a third of the time;
a module imported only inside a function is compiled by the first process that needs it
and kept. Every later process (a test worker, a gateway, a training worker) then reads
the bytecode instead of compiling TensorFlow from source, about 15 s of CPU each.

Run as ``python -m slipway.bytecode`` with bytecode writing on: ``make install`` does so.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Iterator

from slipway import PACKAGES


def project_modules(packages: tuple[str, ...] = PACKAGES) -> Iterator[str]:
    """Every module of ``packages`` by its dotted name, the packages themselves first."""
    for name in packages:
        package = importlib.import_module(name)
        yield name
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            yield module.name


def main() -> int:
    if sys.dont_write_bytecode:
        print(
            "bytecode writing is off (PYTHONDONTWRITEBYTECODE): nothing compiled", file=sys.stderr
        )
        return 1
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    for name in project_modules():
        if name.rpartition(".")[2] != "__main__":
            importlib.import_module(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
