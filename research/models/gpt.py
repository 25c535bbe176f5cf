"""GPT-style decoder language model: causal self-attention, next-token logits, sampling.

The model maps token ids ``(batch, length)`` to logits ``(batch, length, vocab)`` where
position t scores the token at t+1; it is trained on ``next_token_pairs`` with
``PaddedSequenceCrossentropy`` and decoded with ``generate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import tensorflow as tf
import tf_keras as keras

from research.models.attention import block_stack
from research.models.configs import GptConfig
from research.models.endpoints import keras_inputs, only_input
from research.models.layers import PAD_ID, AttentionMask, TokenAndPositionEmbedding
from research.models.specs import HeadSpec, InputSpec


def build(
    config: GptConfig, inputs: Mapping[str, InputSpec], heads: Mapping[str, HeadSpec]
) -> keras.Model:
    """A decoder over the single tokens input with the single language_model head."""
    name = only_input(inputs, ("tokens",), "gpt")
    spec = inputs[name]
    if len(heads) != 1 or next(iter(heads.values())).kind != "language_model":
        kinds = {head: spec.kind for head, spec in heads.items()}
        raise ValueError(f"gpt models have exactly one language_model head, got {kinds}")
    (head,) = heads
    tensors = keras_inputs(inputs)
    ids = tensors[name]
    x = TokenAndPositionEmbedding(
        spec.vocab_size,
        config.position_table_size(name, spec),
        config.d_model,
        name="decoder_embedding",
    )(ids)
    x = keras.layers.Dropout(config.dropout, name="decoder_embedding_dropout")(x)
    mask = AttentionMask(causal=True, name="decoder_mask")(ids)
    x = block_stack(x, mask, config, "decoder")
    x = keras.layers.Dense(spec.vocab_size, name=f"{head}_logits")(x)
    logits = keras.layers.Activation("linear", dtype="float32", name=head)(x)
    return keras.Model(inputs=tensors, outputs={head: logits}, name="gpt")


def next_token_pairs(ids: Any) -> tuple[Any, Any]:
    """``(inputs, targets)`` for language modelling: targets are the inputs shifted by one."""
    return ids[..., :-1], ids[..., 1:]


def generate(
    model: keras.Model,
    prompt_ids: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
    max_new_tokens: int,
    *,
    strategy: Literal["greedy", "top_k"] = "greedy",
    k: int = 10,
    temperature: float = 1.0,
    seed: int | None = None,
) -> np.ndarray:
    """Extend each prompt by ``max_new_tokens`` tokens.

    ``greedy`` takes the most likely token; ``top_k`` samples among the ``k`` most likely
    after dividing the logits by ``temperature``, from a NumPy generator seeded with
    ``seed`` so a seed always gives the same text. Padding (id 0) is never generated.
    A sequence longer than the context window is read through its last window.
    Returns the prompts followed by the new tokens, 1-D for one prompt, else 2-D.
    """
    if strategy not in ("greedy", "top_k"):
        raise ValueError(f"strategy must be 'greedy' or 'top_k', got {strategy!r}")
    if max_new_tokens < 0 or k < 1 or temperature <= 0:
        raise ValueError("max_new_tokens must be >= 0, k >= 1 and temperature > 0")
    prompts = np.asarray(prompt_ids, dtype=np.int64)
    single = prompts.ndim == 1
    sequences = prompts[np.newaxis] if single else prompts
    if sequences.ndim != 2 or sequences.shape[1] == 0:
        raise ValueError(
            f"prompt_ids must be a non-empty sequence or a 2-D batch, got {prompts.shape}"
        )
    window, padded = _context(model)
    rng = np.random.default_rng(seed)
    for _ in range(max_new_tokens):
        context = sequences[:, -window:]
        length = context.shape[1]
        if padded:
            context = np.pad(context, ((0, 0), (0, window - length)), constant_values=PAD_ID)
        logits = _logits(model, context)[:, length - 1].astype(np.float64)
        logits[:, PAD_ID] = -np.inf
        if strategy == "greedy":
            chosen = np.argmax(logits, axis=-1)
        else:
            chosen = np.array([_sample_top_k(row / temperature, k, rng) for row in logits])
        sequences = np.concatenate([sequences, chosen[:, np.newaxis]], axis=1)
    return sequences[0] if single else sequences


def _context(model: keras.Model) -> tuple[int, bool]:
    """The context window, and whether the model wants it padded to a fixed length.

    Right padding is harmless here: causal attention never lets a position see later ones.
    """
    fixed = model.inputs[0].shape[1]
    if fixed is not None:
        return fixed, True
    embeddings = [layer for layer in model.layers if isinstance(layer, TokenAndPositionEmbedding)]
    if not embeddings:
        raise ValueError(f"{model.name} has no fixed input length and no position table")
    return embeddings[0].max_length, False


def _logits(model: keras.Model, ids: np.ndarray) -> np.ndarray:
    outputs = model({model.input_names[0]: tf.constant(ids)}, training=False)
    (logits,) = outputs.values()
    return logits.numpy()


def _sample_top_k(logits: np.ndarray, k: int, rng: np.random.Generator) -> int:
    # A stable sort breaks ties by token id, so the candidate set never depends on timing.
    candidates = np.argsort(-logits, kind="stable")[:k]
    candidates = candidates[np.isfinite(logits[candidates])]
    scores = logits[candidates] - logits[candidates].max()
    probabilities = np.exp(scores) / np.exp(scores).sum()
    return int(rng.choice(candidates, p=probabilities))
