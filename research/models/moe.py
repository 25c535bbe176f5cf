"""Mixture-of-experts feed-forward layer (Switch Transformer / GShard routing).

A block's feed-forward network becomes ``num_experts`` networks of the same shape and a
router that sends each token to its ``top_k`` most likely experts, scaled by the
router's probability: parameters grow with the number of experts while each token
still pays for ``top_k`` feed-forward passes. Tokens are dispatched with one-hot
tensors, as GShard does, so the computation has static shapes (XLA, TFLite, DTensor):
within each sequence, an expert takes at most ``capacity = ceil(capacity_factor *
length * top_k / num_experts)`` tokens, in order, and a token past an expert's capacity
skips that expert (the block's residual connection carries it).

A router left alone sends most tokens to a few experts, which then overflow while the
others learn nothing. The auxiliary load-balancing loss of the Switch Transformer,
``num_experts * sum_e(fraction of tokens whose first choice is e * mean router
probability of e)``, is 1 when the load is even and grows as it concentrates; it is
added to the model's losses with weight ``aux_loss_weight``.

The experts' weights are stacked along a leading expert dimension
(``experts_in/kernel``: ``(experts, d_model, ff_dim)``), which a device mesh splits over
its ``model`` axis (``training.mesh``), each device holding whole experts.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras as keras


@keras.saving.register_keras_serializable(package="slipway")
class MixtureOfExperts(keras.layers.Layer):
    """``(..., d_model) -> (..., d_model)`` through the experts each token is routed to."""

    def __init__(
        self,
        num_experts: int,
        ff_dim: int,
        top_k: int = 1,
        capacity_factor: float = 1.25,
        aux_loss_weight: float = 0.01,
        activation: str = "gelu",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        self.num_experts = num_experts
        self.ff_dim = ff_dim
        self.top_k = top_k
        self.capacity_factor = capacity_factor
        self.aux_loss_weight = aux_loss_weight
        self.activation = keras.activations.get(activation)

    def build(self, input_shape: Any) -> None:
        width = int(input_shape[-1])
        experts, hidden = self.num_experts, self.ff_dim
        # The router decides in float32 whatever the policy (its variables are never
        # cast on read): softmax and slot counts must not round a token into another
        # expert.
        self.router_kernel = self.add_weight(
            name="router/kernel",
            shape=(width, experts),
            initializer=keras.initializers.GlorotUniform(),
            dtype="float32",
            experimental_autocast=False,
        )
        self.router_bias = self.add_weight(
            name="router/bias",
            shape=(experts,),
            initializer="zeros",
            dtype="float32",
            experimental_autocast=False,
        )
        self.experts_in_kernel = self.add_weight(
            name="experts_in/kernel",
            shape=(experts, width, hidden),
            initializer=keras.initializers.GlorotUniform(),
        )
        self.experts_in_bias = self.add_weight(
            name="experts_in/bias", shape=(experts, hidden), initializer="zeros"
        )
        self.experts_out_kernel = self.add_weight(
            name="experts_out/kernel",
            shape=(experts, hidden, width),
            initializer=keras.initializers.GlorotUniform(),
        )
        self.experts_out_bias = self.add_weight(
            name="experts_out/bias", shape=(experts, width), initializer="zeros"
        )
        super().build(input_shape)

    def capacity(self, tokens: int) -> int:
        """Slots each expert has for a sequence of ``tokens``."""
        share = self.capacity_factor * tokens * self.top_k / self.num_experts
        return max(1, math.ceil(share))

    def route(self, tokens: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """``(combine, aux_loss)`` for ``(batch, length, d_model)`` tokens.

        Each sequence is a routing group (GShard's groups), so capacities are static
        whatever the batch. ``combine`` is ``(batch, length, experts, capacity)``: the
        router probability with which a token's output at a slot of an expert is added
        back, zero where the token is not there. Choices are filled by rank (every
        token's first choice before any second), so a crowded expert drops second
        choices first.
        """
        length = tokens.shape[1]
        capacity = self.capacity(length)
        logits = tf.einsum("bld,de->ble", tokens, self.router_kernel) + self.router_bias
        probabilities = tf.nn.softmax(logits, axis=-1)  # (B, L, E)
        remaining = probabilities
        used = tf.zeros_like(probabilities[:, :1, :])  # slots taken per expert: (B, 1, E)
        combine = 0.0
        first_choice = None
        for _ in range(self.top_k):
            choice = tf.one_hot(tf.argmax(remaining, axis=-1), self.num_experts)  # (B, L, E)
            if first_choice is None:
                first_choice = choice
            slot = tf.cumsum(choice, axis=1, exclusive=True) + used  # (B, L, E)
            kept = choice * tf.cast(slot < capacity, tf.float32)
            gate = tf.reduce_sum(probabilities * kept, axis=-1)  # (B, L)
            position = tf.one_hot(
                tf.cast(tf.reduce_sum(slot * kept, axis=-1), tf.int32), capacity
            )  # (B, L, C)
            combine += gate[..., None, None] * kept[..., None] * position[:, :, None, :]
            used += tf.reduce_sum(choice, axis=1, keepdims=True)
            remaining = remaining * (1.0 - choice)
        fraction = tf.reduce_mean(first_choice, axis=[0, 1])
        mean_probability = tf.reduce_mean(probabilities, axis=[0, 1])
        aux_loss = self.num_experts * tf.reduce_sum(fraction * mean_probability)
        return combine, aux_loss

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        if inputs.shape.rank != 3 or inputs.shape[1] is None:
            raise ValueError(
                f"{self.name}: experts route sequences of a fixed length, "
                f"got inputs of shape {inputs.shape}"
            )
        combine, aux_loss = self.route(tf.cast(inputs, tf.float32))
        self.add_loss(self.aux_loss_weight * aux_loss)
        compute = inputs.dtype
        dispatch = tf.cast(combine > 0, compute)
        routed = tf.einsum("blec,bld->becd", dispatch, inputs)  # (B, E, C, d)
        kernel_in = tf.cast(self.experts_in_kernel, compute)
        hidden = tf.einsum("becd,edh->bech", routed, kernel_in)
        hidden = self.activation(hidden + tf.cast(self.experts_in_bias, compute)[:, None, :])
        kernel_out = tf.cast(self.experts_out_kernel, compute)
        out = tf.einsum("bech,ehd->becd", hidden, kernel_out)
        out += tf.cast(self.experts_out_bias, compute)[:, None, :]
        return tf.einsum("blec,becd->bld", tf.cast(combine, compute), out)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "ff_dim": self.ff_dim,
            "top_k": self.top_k,
            "capacity_factor": self.capacity_factor,
            "aux_loss_weight": self.aux_loss_weight,
            "activation": keras.activations.serialize(self.activation),
        }
