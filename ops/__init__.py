"""Ops: the canary rollout controller and deploy assets."""

import contracts  # noqa: F401  (first: it chooses Keras 2 before TensorFlow loads)
