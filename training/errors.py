"""Errors that mean "the experiment is wrong", kept free of TensorFlow imports so the
command line can name them without loading it."""


class TrainingSetupError(ValueError):
    """The experiment cannot run as configured; raised before any training step."""


EXIT_INVALID = 2  # the experiment is wrong; nothing was trained
EXIT_DIVERGED = 3  # the loss stayed non-finite through every allowed restore
