"""The pre-LayerNorm Transformer encoder block (`TransformerBlock`), composed of an
attention, an MLP, layer scale and drop path."""

import keras
from keras import ops

from keras_vit.backend.calls import call_sublayer, regularise
from keras_vit.layers.attention import Attention
from keras_vit.layers.dense import dense_dtypes_entry
from keras_vit.layers.drop_path import DropPath
from keras_vit.layers.mlp import MLP
from keras_vit.layers.normalization import LayerNormalization
from keras_vit.utils.serialization import serializable


@serializable
class TransformerBlock(keras.layers.Layer):
    """Pre-LayerNorm Transformer encoder block.

    `x = x + DropPath(Dropout(Attention(LN(x))))`, then `x = x + DropPath(MLP(LN(x)))`,
    each branch scaled by its layer scale before the dropout when `layer_scale_init` is
    set. The attention is `keras_vit.layers.attention.Attention` (with the rotary table
    when `rope`); the MLP is `keras_vit.layers.mlp.MLP`, which shares the block's one
    Dropout. `call(..., return_attention=True)` returns `(outputs, weights)` with weights
    of shape `(batch, heads, tokens, tokens)`. Under the mixed policies the attention
    logits and softmax are float32 (see `Attention`), as are the LayerNorm statistics
    (Keras computes them in float32).

    Args:
        num_heads: attention heads; must divide the width.
        mlp_dim: hidden width of the MLP.
        dropout_rate: dropout after the attention and in the MLP.
        attention_dropout_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth rate of both residual branches.
        layer_norm_epsilon: 1e-6 as in the official code.
        gelu_approximate: False for exact (erf) GELU as timm and HF, True for the
            tanh form of the official JAX code.
        layer_scale_init: None, or the initial value of learned per-channel scales
            on both residual branches, `x = x + gamma * f(x)` (CaiT's and DeiT III's
            layer scale, timm's `init_values`; DeiT III uses 1e-6).
        mlp: `"gelu"` (the paper's MLP) or `"swiglu"`: `mlp_fc1` is `Dense(2 * mlp_dim)`
            whose halves `gate | up` give `silu(gate) * up` to `mlp_fc2` (DINOv2's giant
            model; timm's `SwiGLUPacked`, HF's `use_swiglu_ffn`).
        dense_dtypes: policies of the quantized Dense sublayers by name (written
            by `get_config` after `model.quantize`); None builds them with the default policy.
        quick_gelu: CLIP's `x * sigmoid(1.702 x)` in place of GELU.
        rope: rotary position embedding: the queries and keys are rotated by the table
            passed as `call(x, rope=table)` (`keras_vit.layers.rope.rotate`).
            `call(x, token_mask=mask)` keeps the padded tokens of a NaFlex batch out of
            the attention (see `Attention`).
        mlp_norm: a LayerNorm on the MLP's hidden features before `mlp_fc2` (EVA-02's
            `SwiGLU(norm_layer=...)`, timm's `scale_mlp=True`).

    Example:

    >>> block = TransformerBlock(num_heads=4, mlp_dim=64)
    >>> tokens = keras.random.uniform((2, 17, 32))
    >>> tuple(block(tokens).shape)
    (2, 17, 32)
    >>> _, weights = block(tokens, return_attention=True)
    >>> tuple(weights.shape)
    (2, 4, 17, 17)
    """

    # Each pair widens the tokens and narrows them back (q|k|v, per-head attention,
    # output; fc1, GELU, fc2) with nothing in between mixing the wide features across
    # columns: what tensor parallelism splits (keras_vit.training.jax_distribution).
    # The names are the sublayers' names, hence their weights' paths.
    PROJECTION_PAIRS = (Attention.DENSE_LAYERS, MLP.DENSE_LAYERS)
    DENSE_LAYERS = tuple(name for pair in PROJECTION_PAIRS for name in pair)

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        layer_scale_init=None,
        dense_dtypes=None,
        mlp="gelu",
        quick_gelu=False,
        rope=False,
        mlp_norm=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        self.mlp = mlp
        self.quick_gelu = bool(quick_gelu)
        self.rope = bool(rope)
        dense_dtypes = dict(dense_dtypes or {})
        # Made in this order, each layer draws the seeds of its initializers and
        # dropout from Keras' global seed as the block always has: a seeded model
        # starts from the same weights.
        attention = Attention(
            self.num_heads, dropout_rate=attention_dropout_rate, rope=self.rope,
            dense_dtypes={k: v for k, v in dense_dtypes.items() if k in Attention.DENSE_LAYERS},
            name="attention",
        )
        dropout = keras.layers.Dropout(dropout_rate)
        drop_path = DropPath(drop_path_rate)
        mlp_layer = MLP(
            self.mlp_dim, kind=mlp, gelu_approximate=gelu_approximate, quick_gelu=quick_gelu,
            norm_epsilon=layer_norm_epsilon if mlp_norm else None, dropout=dropout,
            dense_dtypes={k: v for k, v in dense_dtypes.items() if k in MLP.DENSE_LAYERS},
            name="mlp",
        )
        # The sublayers that hold variables are the block's attributes too, under the
        # names and in the order they have always had: a `.keras` file stores each
        # variable under the first public attribute path that reaches it (private ones
        # are visited last), and `model.variables` (hence optimizer states and run
        # backups) lists them in the order their layers were set.
        self.mlp_norm = mlp_layer.mlp_norm
        self.norm1 = LayerNormalization(epsilon=layer_norm_epsilon, name="norm1")
        self.norm2 = LayerNormalization(epsilon=layer_norm_epsilon, name="norm2")
        self.attention_dropout = attention.dropout
        self.dropout = dropout
        self.drop_path = drop_path
        self.mlp_fc1 = mlp_layer.mlp_fc1
        self._attention = attention
        self._mlp = mlp_layer

    def build(self, input_shape):
        token_shape = tuple(input_shape)
        for layer in (self.norm1, self.norm2, self._attention, self._mlp):
            layer.build(token_shape)
        self.qkv = self._attention.qkv
        self.attention_output = self._attention.attention_output
        self.mlp_fc2 = self._mlp.mlp_fc2
        self.head_dim = self._attention.head_dim
        self.layer_scales = ()
        if self.layer_scale_init is not None:
            init = keras.initializers.Constant(self.layer_scale_init)
            self.layer_scales = tuple(
                self.add_weight(name=name, shape=(token_shape[-1],), initializer=init)
                for name in ("layer_scale_attention", "layer_scale_mlp")
            )
        # `call` skips DropPath at inference, and `model.quantize` refuses unbuilt layers
        # (Keras' Dropout builds itself at construction).
        self.drop_path.build(token_shape)

    def projections(self):
        """The block's `Dense` layers, in `PROJECTION_PAIRS` order: `qkv`,
        `attention_output`, `mlp_fc1`, `mlp_fc2` (the block must be built)."""
        return tuple(getattr(self, name) for name in self.DENSE_LAYERS)

    def _scale(self, y, branch):
        # Layer scale multiplies each residual branch before it is added (timm's LayerScale).
        if not self.layer_scales:
            return y
        return y * ops.cast(self.layer_scales[branch], y.dtype)

    def call(self, x, training=False, return_attention=False, rope=None, token_mask=None):
        attended = call_sublayer(
            self, self._attention, call_sublayer(self, self.norm1, x), training=training,
            return_attention=return_attention, rope=rope, token_mask=token_mask,
        )
        attended, weights = attended if return_attention else (attended, None)
        x = x + regularise(self._scale(attended, 0), training, self.dropout, self.drop_path)
        y = call_sublayer(self, self._mlp, call_sublayer(self, self.norm2, x), training=training)
        x = x + regularise(self._scale(y, 1), training, self.drop_path)
        return (x, weights) if return_attention else x

    def rematerialized_call(self, layer_call, *args, **kwargs):
        if super().rematerialized_call(layer_call, *args, **kwargs) is layer_call:
            return layer_call
        variables = self.variables

        def call(x, **flags):
            # Keras' remat (`jax.checkpoint` on JAX) traces every argument, and `call`
            # branches in Python on `training` and `return_attention`: those are bound.
            # A rematerialised function may not leave a value in a variable (dropout's
            # seed state): the block's variables go in and come out as values, and the
            # new seed states are assigned outside it.
            def pure(x, *values):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))) as scope:
                    outputs = layer_call(x, **flags)
                return outputs, [scope.get_current_value(v) for v in variables]

            outputs, values = keras.remat(pure)(x, *(v.value for v in variables))
            for variable, value in zip(variables, values):
                if not variable.trainable:
                    variable.assign(value)
            return outputs

        return call

    def compute_output_spec(self, x, training=False, return_attention=False, rope=None,
                            token_mask=None):
        # From the shapes alone: Keras would otherwise trace `call` on every symbolic
        # call, most of the time it takes to build a model. The block's outputs and
        # attention weights have its attention's shapes and dtypes.
        return self._attention.compute_output_spec(x, return_attention=return_attention)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "drop_path_rate": self.drop_path_rate,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            # Only when set: the configs of blocks without layer scale stay as they were.
            **({} if self.layer_scale_init is None else {"layer_scale_init": self.layer_scale_init}),
            **({} if self.mlp == "gelu" else {"mlp": self.mlp}),
            **({"quick_gelu": True} if self.quick_gelu else {}),
            **({"rope": True} if self.rope else {}),
            **({"mlp_norm": True} if self.mlp_norm is not None else {}),
            **dense_dtypes_entry(self, self.DENSE_LAYERS),
        }
