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


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
