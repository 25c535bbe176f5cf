"""The ``slipway`` command line: one entry point over the five packages."""

import contracts  # noqa: F401  (first: it chooses Keras 2 before TensorFlow loads)

# Every package of the project, the command line's own last.
PACKAGES = ("contracts", "research", "training", "compression", "serving", "ops", "slipway")
