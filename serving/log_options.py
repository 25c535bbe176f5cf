"""The ``--log-level`` option of the long-running serving processes, and what it sets.

The gateway and the routing source log to standard error the same way, so their logs
read alike when an operator follows both.
"""

from __future__ import annotations

import argparse
import logging

LOG_LEVELS = ("debug", "info", "warning", "error")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="Least severe log messages written to standard error. Default: %(default)s.",
    )


def configure_logging(level: str, process: str | None = None) -> None:
    """``process`` names which of several processes writing to one stream says what (a
    pool's workers)."""
    where = "" if process is None else f"[{process}] "
    logging.basicConfig(
        level=level.upper(), format=f"%(asctime)s %(levelname)s {where}%(name)s: %(message)s"
    )
