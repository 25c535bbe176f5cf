"""Compression: pruning, quantization and TFLite/SavedModel export with a trade-off report."""

import contracts  # noqa: F401  (first: it chooses Keras 2 before TensorFlow loads)
