"""Activation recomputation: keep a block's input, not its activations, for the backward pass.

A Transformer block at sequence length L keeps several ``(batch, heads, L, L)`` tensors
(scores, softmax, dropout mask) alive from the forward pass until its gradients are
taken, so activation memory grows with depth times L². ``Recomputed`` runs its block
under ``tf.recompute_grad`` when training: the forward pass keeps only the block's
input, and the backward pass runs the block again to get what its gradients need,
one block at a time. Memory of the stacked activations is traded for a second forward.

The second forward must draw the same dropout masks as the first, or the gradients
would belong to another model. Dropout here draws from ``tf.random.Generator`` states
(see ``training.trainer.configure_determinism``); the wrapper reads those states before
the block runs and puts them back at the start of every run, so both runs draw the same
numbers and leave the generators exactly where a single forward pass would. A model
trained with recomputation therefore makes the updates the plain model makes.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras


def _dropout_generators(layer: keras.layers.Layer) -> list[tf.random.Generator]:
    """The ``tf.random.Generator`` every dropout-like sublayer of ``layer`` draws from."""
    generators = []
    for sublayer in layer._flatten_layers(include_self=True):
        random = getattr(sublayer, "_random_generator", None)
        if random is None:
            continue
        random._maybe_init()  # generators are made lazily; never inside the recomputation
        if isinstance(random._generator, tf.random.Generator):
            generators.append(random._generator)
    return generators


def _restore(generator: tf.random.Generator, state: tf.Tensor) -> None:
    """Put ``state`` back into ``generator``, in the replica's own copy under a strategy.

    A generator advances its state variable through the variable's handle, which in a
    replica context is that replica's copy; restoring goes the same way (a mirrored
    variable's ``assign`` in a replica context would ask for an aggregation).
    """
    tf.raw_ops.AssignVariableOp(resource=generator.state.handle, value=state)


@keras.saving.register_keras_serializable(package="slipway")
class Recomputed(keras.layers.Wrapper):
    """``layer`` called on ``[x, *context]``, its activations recomputed when training.

    ``x`` is the floating-point tensor gradients flow through; ``context`` (an
    attention mask, say) is passed as it is and gets no gradient. Outside training the
    wrapper is the layer itself.
    """

    def build(self, input_shape: Any) -> None:
        if not self.layer.built:
            self.layer.build(input_shape)
        super().build(input_shape)

    def call(self, inputs: list[Any], training: bool | None = None) -> Any:
        if not training:
            return self.layer(inputs, training=training)
        x, *context = inputs
        generators = _dropout_generators(self.layer)
        states = [tf.identity(generator.state) for generator in generators]

        def forward(x: tf.Tensor) -> tf.Tensor:
            for generator, state in zip(generators, states, strict=True):
                _restore(generator, state)
            return self.layer([x, *context], training=True)

        return tf.recompute_grad(forward)(x)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.layer.compute_output_shape(input_shape)


def has_recomputation(model: keras.Model) -> bool:
    """Whether some block of ``model`` is recomputed in its backward pass."""
    return any(isinstance(layer, Recomputed) for layer in model._flatten_layers())
