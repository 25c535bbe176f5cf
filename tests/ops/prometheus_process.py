"""``PrometheusProcess`` for ``benchmarks/rollout.py``, which imports it from here; the tests
import it from ``tests.support.prometheus``."""

from tests.support.prometheus import PrometheusProcess

__all__ = ["PrometheusProcess"]
