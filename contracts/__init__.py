"""What crosses package boundaries as files, written down once.

Every other package (``research``, ``training``, ``compression``, ``serving``, ``ops``)
may import this one and it imports none of them: atomic writes and file digests, the
dataset manifest and its feature spec, the ``slipway.json`` model manifest, and the
YAML loader whose errors name the file, the line and the key.
"""

import os

# ``tf.keras`` is tf_keras (Keras 2) in every Slipway process: the models, the compression
# tools and researchers' own ``tf.keras`` code then share one Keras. TensorFlow reads this
# once, on its first import; without it, that import also loads Keras 3 and, through it,
# scikit-learn: about 1.5 s of every process's start. Every package imports this one first.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
