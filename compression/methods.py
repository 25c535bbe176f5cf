"""The compression methods by name, without importing TensorFlow.

The CLI lists them in ``--help`` and validates ``--method`` before anything heavy loads;
the pipeline runs them. Both read the names here, so neither imports the other's module.
"""

METHOD_NAMES = (
    "float32", "dynamic_range", "float16", "int8", "int8_io",
    "prune", "prune_2_4", "qat", "prune_qat", "cluster", "distill",
)  # fmt: skip

# What ``--then`` may apply to a distilled student.
THEN_METHODS = ("int8",)

# Results whose weights and activations are integers: what "publish the int8 model" means.
INTEGER_METHODS = ("int8", "int8_io", "qat", "prune_qat")

# Distillation's soft-target temperature and the soft targets' share of the loss.
DEFAULT_TEMPERATURE = 4.0
DEFAULT_ALPHA = 0.7
