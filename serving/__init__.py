"""Serving: the TensorFlow Serving-compatible gateway."""
