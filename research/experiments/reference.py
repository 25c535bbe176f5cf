"""The experiment reference (``docs/reference/experiment.md``), generated from the config models.

Every key of an experiment file, from ``ExperimentConfig`` down to each model family's
options, with its type, constraints, default and meaning, so the reference cannot drift
from what ``load_experiment`` accepts: ``tests/docs/test_reference_pages.py`` fails when
the committed page and this output differ. Regenerate it with::

    python -m research.experiments.reference > docs/reference/experiment.md

A key's meaning is its field's ``description`` when the model gives one, else the entry
for its field in ``DESCRIPTIONS`` below (``contracts.config_reference.describe``).
"""

from __future__ import annotations

from contracts.config_reference import Key, config_keys, render_reference
from research.experiments.config import (
    AugmentationConfig,
    CheckpointConfig,
    DataConfig,
    DistributionConfig,
    ExperimentConfig,
    ExportConfig,
    NonFiniteConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainingConfig,
)
from research.models.configs import (
    CnnConfig,
    ExpertsConfig,
    MlpConfig,
    MultiTaskConfig,
    PythonModelConfig,
    TransformerConfig,
    TransformerShape,
)
from research.models.specs import HeadSpec

HEAD = "<head>"  # a head's name: a label of the dataset

DESCRIPTIONS: dict[tuple[type, str], str] = {
    (ExperimentConfig, "name"): "the experiment's name: the default run directory and model name",
    (ExperimentConfig, "seed"): "seeds weights, shuffling, dropout and augmentation",
    (ExperimentConfig, "data"): "what the model reads",
    (ExperimentConfig, "training"): "how long and how the model is trained",
    (ExperimentConfig, "distribution"): "how training spreads over devices",
    (ExperimentConfig, "checkpoint"): "when checkpoints are written and how many are kept",
    (ExperimentConfig, "export"): "where the trained model is published",
    (DataConfig, "train_split"): "the split trained on",
    (DataConfig, "eval_split"): "the split evaluated during and after training; null: none",
    (DataConfig, "test_split"): "the split evaluated once after training; null: none",
    (DataConfig, "shuffle_buffer"): "records shuffled together (each epoch in another order)",
    (DataConfig, "sequence_length"): "tokens per text input, padded or truncated; default: "
    "the longest sequence the manifest's statistics record",
    (DataConfig, "cache"): "keep the training records in memory after the first epoch",
    (DataConfig, "augment"): "random image transforms of the training batches; null: none",
    (DataConfig, "token_dropout"): "fraction of the training tokens replaced by the unknown "
    "token (padding stays padding)",
    (AugmentationConfig, "flip"): "flip half the images left to right",
    (AugmentationConfig, "crop_padding"): "translate each image by up to this many pixels "
    "(zero-padded, then cropped back to its size)",
    (AugmentationConfig, "brightness"): "add one uniform value in [-brightness, brightness] "
    "per image, clipped to [0, 1]",
    (MlpConfig, "hidden_units"): "widths of the hidden Dense layers; [] is a linear model",
    (MlpConfig, "activation"): "activation of the hidden layers",
    (MlpConfig, "dropout"): "dropout rate after each hidden layer",
    (MlpConfig, "batch_norm"): "batch normalization after each hidden layer",
    (MlpConfig, "embedding_dim"): "width of the learned embedding of categorical ids and tokens",
    (MlpConfig, "batch_norm_momentum"): "momentum of the batch norms' moving statistics",
    (CnnConfig, "stem_filters"): "filters of the stem convolution",
    (CnnConfig, "stages"): "filters of each stage of residual blocks; every stage after the "
    "first halves the resolution",
    (CnnConfig, "blocks_per_stage"): "residual blocks in each stage",
    (CnnConfig, "kernel_size"): "side of every convolution's kernel",
    (CnnConfig, "dropout"): "dropout rate on the pooled features",
    (CnnConfig, "batch_norm_momentum"): "momentum of the batch norms' moving statistics",
    (TransformerShape, "num_layers"): "Transformer blocks",
    (TransformerShape, "d_model"): "width of the token representations",
    (TransformerShape, "num_heads"): "attention heads; must divide d_model",
    (TransformerShape, "ff_dim"): "width of each block's feed-forward layer (of each expert's)",
    (TransformerShape, "dropout"): "dropout rate in attention and feed-forward layers",
    (TransformerShape, "norm"): "pre: layer norm before attention and feed-forward; post: after",
    (TransformerShape, "max_length"): "rows of the position table; default: the input's "
    "sequence length",
    (TransformerShape, "recompute"): "keep only each block's input for the backward pass and "
    "run the block again there: less activation memory, more compute",
    (TransformerShape, "experts"): "a mixture of experts as every block's feed-forward layer; "
    "null: one dense feed-forward layer",
    (ExpertsConfig, "num_experts"): "experts per block",
    (ExpertsConfig, "top_k"): "experts each token is routed to",
    (ExpertsConfig, "capacity_factor"): "tokens an expert takes per sequence, as a multiple of "
    "an even share; a token past capacity skips that expert",
    (ExpertsConfig, "aux_loss_weight"): "weight of the load-balancing loss added to the model's",
    (TransformerConfig, "pooling"): "mean: the masked mean of the tokens; cls: a prepended "
    "classification token",
    (MultiTaskConfig, "trunk"): "the network every head shares",
    (MultiTaskConfig, "head_hidden_units"): "widths of the hidden layers each head adds",
    (MultiTaskConfig, "head_activation"): "activation of the heads' hidden layers",
    (MultiTaskConfig, "head_dropout"): "dropout rate after each of the heads' hidden layers",
    (PythonModelConfig, "build"): "package.module:function or path/to/file.py:function "
    "(relative to the experiment file) that returns a tf_keras model",
    (PythonModelConfig, "args"): "keyword arguments the build function is called with",
    (HeadSpec, "kind"): "classification (softmax over num_classes), regression (units values "
    "in the label's units) or language_model (next-token logits)",
    (HeadSpec, "num_classes"): "classes of a classification head (at least 2)",
    (HeadSpec, "units"): "values a regression head outputs",
    (HeadSpec, "loss_weight"): "how much the head's loss counts in the total",
    (HeadSpec, "target_mean"): "regression: the head outputs standard units times target_std "
    "plus this (heads made from a dataset label take the training split's mean)",
    (HeadSpec, "target_std"): "regression: the scale of the head's output (heads made from a "
    "dataset label take the training split's standard deviation)",
    (TrainingConfig, "epochs"): "passes over the training split; give epochs or steps",
    (TrainingConfig, "precision"): "auto: the fastest policy a probe finds on this machine "
    "for this model (cached); or a fixed Keras mixed-precision policy",
    (TrainingConfig, "deterministic"): "TensorFlow's op determinism: bit-reproducible runs, slower",
    (TrainingConfig, "optimizer"): "the optimizer and its constants",
    (TrainingConfig, "schedule"): "the learning rate over the run",
    (TrainingConfig, "nonfinite"): "what a NaN or infinite loss does",
    (TrainingConfig, "eval_every_steps"): "evaluate the eval split every so many updates; "
    "null: only at the end",
    (OptimizerConfig, "learning_rate"): "peak learning rate (after warm-up)",
    (OptimizerConfig, "weight_decay"): "decoupled weight decay",
    (OptimizerConfig, "clip_global_norm"): "clip the gradients to this global norm; null: no "
    "clipping",
    (ScheduleConfig, "warmup_steps"): "updates of linear warm-up to the learning rate",
    (ScheduleConfig, "decay"): "the learning rate's shape after warm-up",
    (ScheduleConfig, "final_learning_rate_ratio"): "the last update's learning rate, as a "
    "fraction of the peak",
    (NonFiniteConfig, "learning_rate_factor"): "factor the learning rate is multiplied by at "
    "each restore",
    (NonFiniteConfig, "max_restores"): "restores before the run stops as diverged (exit 3)",
    (DistributionConfig, "mesh"): "shard weights over a device mesh (DTensor); null: replicate",
    (DistributionConfig, "pipeline"): "place consecutive blocks on consecutive devices",
    (CheckpointConfig, "every_steps"): "write a checkpoint every so many updates; null: never "
    "by count",
    (CheckpointConfig, "every_seconds"): "write a checkpoint every so many seconds",
    (CheckpointConfig, "keep"): "newest checkpoints kept",
    (CheckpointConfig, "keep_every_hours"): "also keep one checkpoint per this many hours",
    (ExportConfig, "model_root"): "the model repository versions are published into",
}

HEADER = f"""\
# Experiment reference

Every key of an experiment file (`slipway train EXPERIMENT.yaml`), generated from the
config models in `research/experiments/config.py` and `research/models/configs.py` by

    python -m research.experiments.reference > docs/reference/experiment.md

and checked by a test, so it cannot drift from what training accepts. Paths are relative
to the experiment file. `{HEAD}` stands for a head's name (a label of the dataset).
`training` needs exactly one of `epochs` and `steps`. `model` picks a family by its
`type`; each family's keys are listed under its own heading. A script that builds its own
model (`ExperimentTask(config, model_fn=...)`) may leave `model` out. The files in
`examples/experiments/` are complete experiments.
"""


def experiment_keys() -> list[Key]:
    """Every key of an experiment file, in the order the models declare them."""
    return config_keys(ExperimentConfig, any_name=HEAD)


def render() -> str:
    """The whole reference as Markdown: one table per section."""
    return render_reference(HEADER, experiment_keys(), DESCRIPTIONS)


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
