"""Compression: pruning, quantization and TFLite/SavedModel export with a trade-off report."""
