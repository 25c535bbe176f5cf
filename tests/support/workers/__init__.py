"""Child-process programs the process-tier tests launch, each runnable as ``python -m``."""
