"""The compression methods by name, without importing TensorFlow.

The CLI lists them in ``--help`` and validates ``--method`` before anything heavy loads;
the pipeline runs them. Both read the names here, so neither imports the other's module.
"""

METHOD_NAMES = (
    "float32", "dynamic_range", "float16", "int8", "int8_io",
    "prune", "prune_2_4", "qat", "prune_qat", "cluster",
)  # fmt: skip

# Results whose weights and activations are integers: what "publish the int8 model" means.
INTEGER_METHODS = ("int8", "int8_io", "qat", "prune_qat")
