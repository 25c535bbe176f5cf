"""Which Beam runner builds a dataset: ``--runner`` and the options that go with it.

The build is one Beam pipeline, so ``--runner`` chooses where it runs, as for any
Beam pipeline: Beam's in-process runner when none is named; ``--runner dask`` (or
``DaskRunner``) for Beam's Dask runner as ``research.data.dask_runner`` completes it,
on a local cluster of ``--workers`` processes or, with Beam's
``--dask_client_address``, on a running ``dask.distributed`` cluster;
``--runner DataflowRunner`` or ``--runner FlinkRunner`` with Beam's own options.
This module needs nothing from Dask, so a build that does not use it never imports it.
"""

from __future__ import annotations

import argparse
from typing import Any, TypeVar

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from research.data import beam_introspection, beam_pickling

IN_PROCESS_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
DASK_RUNNER = "research.data.dask_runner.DaskRunner"
DASK_RUNNER_NAMES = frozenset({"dask", "DaskRunner"})
DEFAULT_DASK_WORKERS = 2
# Beam's Dask options that name a running cluster.
CLUSTER_OPTIONS = frozenset({"--dask_client_address", "--dask_scheduler_file"})

View = TypeVar("View", bound=PipelineOptions)

# Whoever chooses a runner is about to build a pipeline: from here on, Beam inspects each
# function's parameters once (see ``beam_introspection``) and compresses each distinct
# pickled function once (see ``beam_pickling``).
beam_introspection.install()
beam_pickling.install()


class BuildOptions(PipelineOptions):
    """Beam's options, with one view per options class instead of one per question.

    Beam asks the pipeline's options for a view on every transform it applies and every type
    it checks (``view_as(TypeOptions)``), and each view builds an argparse parser and parses
    the command line again: about a thousand parses per dataset build, a quarter of the time
    it takes to construct one. A view holds no values of its own (it reads and writes the
    options' shared ``_all_options``) and the command line does not change, so the first view
    of a class serves every later question.
    """

    def view_as(self, cls: type[View]) -> View:
        views: dict[type, PipelineOptions] = self.__dict__.setdefault("_views", {})
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]  # type: ignore[return-value]

    def __getstate__(self) -> dict[str, Any]:
        """Without the views: a copy (Beam deep-copies a pipeline's options) makes its own."""
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state


class LocalClusterOptions(PipelineOptions):
    """``--workers``: how many local Dask worker processes a ``--runner dask`` build starts."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--workers",
            type=int,
            default=None,
            help=f"with --runner dask: local worker processes (default {DEFAULT_DASK_WORKERS})",
        )


def pipeline_options(beam_args: list[str] | None) -> PipelineOptions:
    """Beam options from the command line; the in-process runner unless one is named.

    Raises ``ValueError`` for options that contradict each other.
    """
    options = BuildOptions(beam_args or [])
    standard = options.view_as(StandardOptions)
    if not standard.runner:
        standard.runner = IN_PROCESS_RUNNER
    elif standard.runner in DASK_RUNNER_NAMES:
        standard.runner = DASK_RUNNER
    workers = options.view_as(LocalClusterOptions).workers
    if workers is not None:
        if standard.runner != DASK_RUNNER:
            raise ValueError("--workers starts local Dask workers: it needs --runner dask")
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        if any(arg.split("=")[0] in CLUSTER_OPTIONS for arg in beam_args or []):
            raise ValueError(
                "--workers starts a local cluster; with a cluster to connect to, "
                "its own workers run the build"
            )
    return options
