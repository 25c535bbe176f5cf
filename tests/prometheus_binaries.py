"""Where the suite's closing summary finds the Prometheus skip reason: ``tests.support.prometheus``."""

from tests.support.prometheus import INSTALL_HINT, MISSING, binary

__all__ = ["INSTALL_HINT", "MISSING", "binary"]
