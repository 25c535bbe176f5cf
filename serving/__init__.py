"""Serving: the TensorFlow Serving-compatible gateway."""

import contracts  # noqa: F401  (first: it chooses Keras 2 before TensorFlow loads)
