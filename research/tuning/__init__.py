"""Hyper-parameter search: a space file over an experiment's keys, searched with keras-tuner.

``space`` reads and checks search spaces; ``search`` runs them (``run_search``) and writes
each search's results and best experiment. Nothing is imported here so that the command
line can register ``slipway tune`` without loading TensorFlow.
"""
