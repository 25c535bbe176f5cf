"""Training: the trainer, distribution, checkpoints and export."""
