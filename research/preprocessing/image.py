"""Encoded images (PNG, JPEG, GIF, BMP) decoded and sized in the graph.

A client sends the file it has; the model needs ``height x width x channels`` floats in
``[0, 1]``. Decoding and resizing run as TensorFlow ops in the served graph and in the
input pipeline alike, so a picture is read the same way in both. An image already the
model's size comes out of the resize unchanged, bit for bit, so the dataset's images are
not blurred on their way into training.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from contracts.features import FeatureSpec


@keras.utils.register_keras_serializable(package="slipway")
class ImageDecoder(keras.layers.Layer):
    """Encoded images ``[batch]`` -> float32 ``[batch, height, width, channels]`` in [0, 1].

    A missing image (the empty string) becomes an all-zero image. An image of another
    size is resized (bilinear, antialiased when shrinking); its channels are converted to
    ``channels`` by the decoder (grey to RGB and back, alpha dropped).
    """

    def __init__(self, height: int, width: int, channels: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.height, self.width, self.channels = int(height), int(width), int(channels)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        encoded = tf.reshape(inputs, [-1])
        size = [self.height, self.width]
        # Missing images are swapped for a blank PNG up front, so the per-image loop
        # is a bare decode (a branch inside it costs more than decoding a small image).
        blank = tf.io.encode_png(tf.zeros([*size, self.channels], tf.uint8))
        encoded = tf.where(tf.strings.length(encoded) > 0, encoded, blank)

        def decode(image: tf.Tensor) -> tf.Tensor:
            pixels = tf.io.decode_image(image, channels=self.channels, expand_animations=False)
            return tf.image.resize(pixels, size, antialias=True)

        images = tf.map_fn(
            decode,
            encoded,
            fn_output_signature=tf.TensorSpec([*size, self.channels], tf.float32),
        )
        return images * (1.0 / 255.0)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "height": self.height,
            "width": self.width,
            "channels": self.channels,
        }


def image_decoder(feature: FeatureSpec) -> ImageDecoder:
    """The decoder to the feature's recorded size."""
    return ImageDecoder(
        height=int(feature.height or 0),
        width=int(feature.width or 0),
        channels=int(feature.channels or 1),
        name=f"{feature.name}_decoded",
    )
