"""Hyper-parameter search: a space file over an experiment's keys, searched with keras-tuner.

``space`` (no TensorFlow import) reads and checks search spaces; ``search`` runs them
(``run_search``) and writes each search's results and best experiment.
"""

from research.tuning.space import SearchSpace, TunerSettings, load_space

__all__ = ["SearchSpace", "TunerSettings", "load_space"]
