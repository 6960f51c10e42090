"""The Transformer's MLP (`MLP`: GELU, quick GELU or SwiGLU, with an optional norm), and
its activation (`mlp_activation`)."""

import functools
import math

import keras
from keras import ops

from keras_vit.backend.calls import call_sublayer, regularise
from keras_vit.backend.eager import gelu
from keras_vit.backend.erf import erf
from keras_vit.backend.export import is_tracing_for_export
from keras_vit.layers.dense import Dense, dense_dtypes_entry
from keras_vit.layers.normalization import LayerNormalization
from keras_vit.utils.checks import check_choice, check_positive_int
from keras_vit.utils.keras_compat import InParentNameScope
from keras_vit.utils.serialization import serializable

# The blocks' MLPs: the paper's GELU MLP, and the SwiGLU of DINOv2's giant model.
MLPS = ("gelu", "swiglu")


def mlp_activation(y, approximate=False, quick=False):
    """The MLP's activation: exact (erf) GELU, its tanh form (`approximate`), or
    CLIP's quick GELU `y * sigmoid(1.702 y)` (`quick`).

    Example:

    >>> x = keras.ops.convert_to_tensor([1.0])
    >>> round(float(mlp_activation(x, quick=True)[0]), 4)
    0.8458
    """
    if quick:  # OpenAI CLIP's QuickGELU (HF `quick_gelu`, timm `QuickGELU`)
        return y * ops.sigmoid(ops.cast(1.702, y.dtype) * y)
    if keras.backend.backend() == "torch":
        return gelu(y, approximate=approximate)
    # In float32, rounded once to a 16-bit compute dtype: XLA:CPU computes a chain
    # of 16-bit ops by rounding after each (docs/performance.md).
    x = ops.cast(y, "float32")
    if approximate:
        return ops.cast(keras.activations.gelu(x, approximate=True), y.dtype)
    # Under XLA the erf form beats tf.nn.gelu's and jax.nn.gelu's erfc form
    # (docs/performance.md). `erf` is built from basic ops because
    # JAX lowers lax.erf to a StableHLO composite that TensorFlow cannot load,
    # which would break SavedModel export of JAX-built models (jax2tf). Exports
    # from TensorFlow take its own erf, which the LiteRT converter fuses into one
    # GELU op and tf2onnx maps to ONNX's Erf.
    exporting_tensorflow = keras.backend.backend() == "tensorflow" and is_tracing_for_export()
    erf_op = ops.erf if exporting_tensorflow else erf
    x = x * 0.5 * (1.0 + erf_op(x * (1.0 / math.sqrt(2.0))))
    return ops.cast(x, y.dtype)


def swiglu(y):
    """`silu(gate) * up` of the packed halves `gate | up` of `y`'s last axis (timm's
    `SwiGLUPacked`, DINOv2's `w12`: the gate first).

    Example:

    >>> tuple(swiglu(keras.ops.ones((2, 8))).shape)
    (2, 4)
    """
    gate, up = ops.split(y, 2, axis=-1)
    return ops.silu(gate) * up


@serializable
class MLP(InParentNameScope, keras.layers.Layer):
    """The Transformer block's MLP: `Dense(units) -> activation -> Dropout -> [LayerNorm]
    -> Dense(width) -> Dropout`, the width that of its inputs.

    It opens no name scope of its own: built inside a `TransformerBlock`, its variables
    are the block's (`block/mlp_fc1/kernel`), as its `Dense` and norm are named.

    Args:
        units: the hidden width (`mlp_dim`).
        kind: `"gelu"` (the paper's MLP) or `"swiglu"`: the first Dense is
            `Dense(2 * units)`, whose halves `gate | up` give `silu(gate) * up`
            (DINOv2's giant model; timm's `SwiGLUPacked`, HF's `use_swiglu_ffn`).
        gelu_approximate, quick_gelu: the GELU's form (see `mlp_activation`).
        norm_epsilon: None, or the epsilon of a LayerNorm on the hidden features
            before the last Dense (EVA-02's `SwiGLU(norm_layer=...)`, timm's
            `scale_mlp=True`).
        dropout_rate: dropout after the activation and after the last Dense.
        dropout: the `keras.layers.Dropout` to apply instead of one of `dropout_rate`
            (a block shares its one dropout between its two branches).
        dense_dtypes: policies of the quantized Dense sublayers by name (`mlp_fc1`,
            `mlp_fc2`), as `get_config` writes them after `model.quantize`.

    Returns:
        `(..., width)` features.

    Example:

    >>> mlp = MLP(64, kind="swiglu")
    >>> tuple(mlp(keras.random.uniform((2, 5, 32))).shape)
    (2, 5, 32)
    """

    DENSE_LAYERS = ("mlp_fc1", "mlp_fc2")

    def __init__(self, units, kind="gelu", gelu_approximate=False, quick_gelu=False,
                 norm_epsilon=None, dropout_rate=0.0, dropout=None, dense_dtypes=None,
                 **kwargs):
        super().__init__(**kwargs)
        check_choice("mlp", kind, MLPS)
        self.units = check_positive_int("mlp_dim", units)
        self.kind = kind
        self.gelu_approximate = bool(gelu_approximate)
        self.quick_gelu = bool(quick_gelu)
        self.norm_epsilon = None if norm_epsilon is None else float(norm_epsilon)
        self.dense_dtypes = dict(dense_dtypes or {})
        self.dropout = keras.layers.Dropout(dropout_rate) if dropout is None else dropout
        self.activation = swiglu if kind == "swiglu" else functools.partial(
            mlp_activation, approximate=self.gelu_approximate, quick=self.quick_gelu
        )
        self.mlp_fc1 = Dense(self.units * (2 if kind == "swiglu" else 1), name="mlp_fc1",
                         dtype=self.dense_dtypes.get("mlp_fc1"))
        self.mlp_norm = None
        if self.norm_epsilon is not None:
            self.mlp_norm = LayerNormalization(epsilon=self.norm_epsilon, name="mlp_norm")

    def build(self, input_shape):
        token_shape = tuple(input_shape)
        hidden_shape = (*token_shape[:-1], self.units)
        self.mlp_fc2 = Dense(token_shape[-1], name="mlp_fc2", dtype=self.dense_dtypes.get("mlp_fc2"))
        self.mlp_fc1.build(token_shape)
        self.mlp_fc2.build(hidden_shape)
        if self.mlp_norm is not None:
            self.mlp_norm.build(hidden_shape)

    def call(self, x, training=False):
        y = self.activation(call_sublayer(self, self.mlp_fc1, x))
        y = regularise(y, training, self.dropout)
        if self.mlp_norm is not None:
            y = call_sublayer(self, self.mlp_norm, y)
        return regularise(call_sublayer(self, self.mlp_fc2, y), training, self.dropout)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {
            **super().get_config(),
            "units": self.units,
            "kind": self.kind,
            "gelu_approximate": self.gelu_approximate,
            "quick_gelu": self.quick_gelu,
            "norm_epsilon": self.norm_epsilon,
            "dropout_rate": self.dropout.rate,
            **dense_dtypes_entry(self, self.DENSE_LAYERS),
        }
