"""Experiment configs: what to train, on which data, and how."""

from research.experiments.config import ExperimentConfig, load_experiment

__all__ = ["ExperimentConfig", "load_experiment"]
