"""Training: an experiment Task run by a Trainer (how one step runs) and a Controller
(when to evaluate, checkpoint, stop and publish), as in Orbit.

``training.run.train`` is the one entry point, used by ``slipway train`` and by scripts;
``training.search`` runs every trial of a hyper-parameter search through it as well.
"""

import contracts  # noqa: F401  (first: it chooses Keras 2 before TensorFlow loads)
