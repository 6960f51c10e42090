"""`Dense` on the backends' fastest products, and the config entry of quantized ones."""

import keras
from keras import ops

from keras_vit.backend import products
from keras_vit.backend.export import is_tracing_for_export
from keras_vit.utils.serialization import serializable


def dense_dtypes_entry(layer, names):
    """`{"dense_dtypes": ...}` for the config of a layer whose Dense sublayers `names`
    were quantized, else `{}` (float layers keep their config).

    Keras rebuilds a layer's sublayers from the layer's own config when it loads a
    `.keras` file, so a sublayer that `model.quantize(...)` quantized must be created
    with its quantized dtype policy to take its int8 kernel and scale back.
    """
    dtypes = {
        name: keras.dtype_policies.serialize(getattr(layer, name).dtype_policy)
        for name in names
        if layer.built and getattr(layer, name).quantization_mode is not None
    }
    return {"dense_dtypes": dtypes} if dtypes else {}


@serializable
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` whose 16-bit products reach XLA:CPU's bfloat16 kernels.

    The product and bias are `keras_vit.backend.products.dense`: the numbers of
    `keras.layers.Dense`, but that under a `mixed_bfloat16` or `mixed_float16` policy
    and XLA the product is computed on XLA's 16-bit kernels rather than from float32
    copies of the operands, and the bias added before rounding it (one rounding, not
    two); on PyTorch in float32, as one product that adds the bias.
    Weights, names, LoRA and quantization are those of `keras.layers.Dense`. Inside
    `tracing_for_export()` a product over a sequence is traced as one of a matrix of
    rows, which exporters map to a single matrix-product op.

    Example:

    >>> layer = Dense(4, dtype="mixed_bfloat16")
    >>> outputs = layer(keras.ops.ones((2, 3)))
    >>> tuple(outputs.shape), keras.backend.standardize_dtype(outputs.dtype)
    ((2, 4), 'bfloat16')
    """

    def call(self, inputs, training=None):
        leading = tuple(inputs.shape[1:-1])
        if is_tracing_for_export() and leading and None not in leading:
            # One product of a (rows, features) matrix, which the LiteRT converter
            # turns into one FULLY_CONNECTED op; the general product reaches it as a
            # tensordot, a dozen ops computing its shapes at run time.
            rows = self.call(ops.reshape(inputs, (-1, inputs.shape[-1])), training)
            return ops.reshape(rows, (-1, *leading, rows.shape[-1]))
        # Keras' `kernel` property resolves the quantized and LoRA forms, Python that an
        # eager step (PyTorch) pays on every call; a float kernel without LoRA is the
        # variable itself.
        plain = not self.lora_enabled and self.quantization_mode is None
        x = products.dense(inputs, self._kernel if plain else self.kernel, self.bias)
        return x if self.activation is None else self.activation(x)

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses of Dense only when asked not to check the type,
        # since their `call` may differ; a quantized layer runs Dense's own
        # `quantized_call`, never this `call`.
        super().quantize(mode, type_check=False, config=config)
