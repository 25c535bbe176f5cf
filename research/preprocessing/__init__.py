"""In-graph preprocessing built from a dataset manifest.

The same TensorFlow ops turn raw feature values (numbers as recorded, category and text
strings, encoded images) into what a model's core reads, in the ``tf.data`` input
pipeline during training and inside the exported serving graph, so training and serving
cannot drift apart.
"""
