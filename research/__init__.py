"""Research: data engineering, input pipelines, the model zoo and experiment configs."""

import contracts  # noqa: F401  (first: it chooses Keras 2 before TensorFlow loads)
