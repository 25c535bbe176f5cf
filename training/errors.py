"""Errors that mean "the experiment is wrong", kept free of TensorFlow imports so the
command line can name them without loading it."""

from contracts.dataset_manifest import DatasetError
from contracts.yaml_config import ConfigError
from research.models.specs import ModelInterfaceError


class TrainingSetupError(ValueError):
    """The experiment cannot run as configured; raised before any training step."""


# What a person must fix in an experiment, its space or its dataset: a message, no traceback.
USER_ERRORS = (ConfigError, DatasetError, TrainingSetupError, ModelInterfaceError)

EXIT_OK = 0
EXIT_INVALID = 2  # the experiment is wrong; nothing was trained
EXIT_DIVERGED = 3  # the loss stayed non-finite through every allowed restore
