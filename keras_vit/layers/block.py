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


# The block's keywords that build its attention and its MLP, with their defaults: a
# ready-made sublayer is given without them, and its config is written in their place.
SUBLAYER_SETTINGS = {
    "attention": {"num_heads": None, "attention_dropout_rate": 0.0, "rope": False},
    "mlp": {"mlp_dim": None, "gelu_approximate": False, "quick_gelu": False, "mlp_norm": False},
}


@serializable
class TransformerBlock(keras.layers.Layer):
    """Pre-LayerNorm Transformer encoder block, composed of an attention and an MLP.

    `x = x + DropPath(Dropout(Attention(LN(x))))`, then `x = x + DropPath(MLP(LN(x)))`,
    each branch scaled by its layer scale before the dropout when `layer_scale_init` is
    set. The block calls the sublayers it is given: `attention`, a
    `keras_vit.layers.attention.Attention` (with or without rope), and `mlp`, a
    `keras_vit.layers.mlp.MLP` (or subclasses of them, e.g. an MLP with another
    activation); either may instead be built from the block's own settings
    (`num_heads`, ... for the attention; `mlp_dim`, ... for the MLP), an MLP so built
    sharing the block's one Dropout. Given sublayers must be unbuilt: the block builds
    them, and their variables are the block's (`block/qkv/kernel`) as for built ones.
    `get_config` writes a given sublayer whole (`keras.saving.serialize_keras_object`)
    in place of the settings.

    `call(..., return_attention=True)` returns `(outputs, weights)` with weights of
    shape `(batch, heads, tokens, tokens)`; `call(x, rope=table)` hands the rotary
    table to the attention. Under the mixed policies the attention logits and softmax
    are float32 (see `Attention`), as are the LayerNorm statistics (Keras computes them
    in float32).

    Args:
        num_heads: attention heads; must divide the width. Builds the attention,
            with `attention_dropout_rate` and `rope`; leave these unset with `attention`.
        mlp_dim: hidden width of the MLP. Builds the MLP, with `mlp` (a kind),
            `gelu_approximate`, `quick_gelu` and `mlp_norm`; leave these unset with
            `mlp` a layer.
        dropout_rate: dropout after the attention, and in an MLP built from `mlp_dim`
            (a given MLP has its own).
        attention_dropout_rate: dropout on the attention weights.
        drop_path_rate: stochastic depth rate of both residual branches.
        layer_norm_epsilon: of the block's norms (and of a built MLP's `mlp_norm`);
            1e-6 as in the official code.
        gelu_approximate: False for exact (erf) GELU as timm and HF, True for the
            tanh form of the official JAX code.
        layer_scale_init: None, or the initial value of learned per-channel scales
            on both residual branches, `x = x + gamma * f(x)` (CaiT's and DeiT III's
            layer scale, timm's `init_values`; DeiT III uses 1e-6).
        dense_dtypes: policies of the quantized Dense sublayers that the block builds,
            by name (written by `get_config` after `model.quantize`); None builds them
            with the default policy.
        mlp: a ready-made `MLP`, or the kind of the one to build: `"gelu"` (the
            paper's MLP) or `"swiglu"`: `mlp_fc1` is `Dense(2 * mlp_dim)` whose halves
            `gate | up` give `silu(gate) * up` to `mlp_fc2` (DINOv2's giant model;
            timm's `SwiGLUPacked`, HF's `use_swiglu_ffn`). The attribute `block.mlp`
            is the MLP's kind either way.
        quick_gelu: CLIP's `x * sigmoid(1.702 x)` in place of GELU.
        rope: rotary position embedding: the queries and keys are rotated by the table
            passed as `call(x, rope=table)` (`keras_vit.layers.rope.rotate`).
            `call(x, token_mask=mask)` keeps the padded tokens of a NaFlex batch out of
            the attention, a `(batch, tokens, tokens)` mask each packed image's tokens
            to their own (see `Attention`).
        mlp_norm: a LayerNorm on the MLP's hidden features before `mlp_fc2` (EVA-02's
            `SwiGLU(norm_layer=...)`, timm's `scale_mlp=True`).
        attention: a ready-made `Attention`, or None to build one from `num_heads`.

    Returns:
        `(batch, tokens, width)` tokens; with `return_attention=True`, `(tokens,
        weights)`.

    Example:

    >>> block = TransformerBlock(num_heads=4, mlp_dim=64)
    >>> tokens = keras.random.uniform((2, 17, 32))
    >>> tuple(block(tokens).shape)
    (2, 17, 32)
    >>> _, weights = block(tokens, return_attention=True)
    >>> tuple(weights.shape)
    (2, 4, 17, 17)

    The same block composed of ready-made sublayers, here with eight heads and a
    SwiGLU MLP:

    >>> block = TransformerBlock(
    ...     attention=Attention(num_heads=8), mlp=MLP(64, kind="swiglu"),
    ...     layer_scale_init=1e-6, name="block",
    ... )
    >>> _, weights = block(tokens, return_attention=True)
    >>> tuple(weights.shape), block.mlp, block.qkv.kernel.path
    ((2, 8, 17, 17), 'swiglu', 'block/qkv/kernel')
    """

    # Each pair widens the tokens and narrows them back (q|k|v, per-head attention,
    # output; fc1, GELU, fc2) with nothing in between mixing the wide features across
    # columns: what tensor parallelism splits (keras_vit.training.jax_distribution).
    # The names are the sublayers' names, hence their weights' paths.
    PROJECTION_PAIRS = (Attention.DENSE_LAYERS, MLP.DENSE_LAYERS)
    DENSE_LAYERS = tuple(name for pair in PROJECTION_PAIRS for name in pair)

    def __init__(
        self,
        num_heads=None,
        mlp_dim=None,
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
        attention=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.dropout_rate = float(dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        dense_dtypes = dict(dense_dtypes or {})
        settings = {
            "num_heads": num_heads, "attention_dropout_rate": attention_dropout_rate,
            "rope": rope, "mlp_dim": mlp_dim, "gelu_approximate": gelu_approximate,
            "quick_gelu": quick_gelu, "mlp_norm": mlp_norm,
        }
        self._attention_given = attention is not None
        self._mlp_given = not isinstance(mlp, str)
        # Made in this order, each layer draws the seeds of its initializers and
        # dropout from Keras' global seed as the block always has: a seeded model
        # starts from the same weights.
        if self._attention_given:
            _check_given(attention, Attention, "attention", settings, dense_dtypes)
        else:
            attention = Attention(
                _required("num_heads", num_heads, "attention"),
                dropout_rate=attention_dropout_rate, rope=rope,
                dense_dtypes={k: v for k, v in dense_dtypes.items() if k in Attention.DENSE_LAYERS},
                name="attention",
            )
        dropout = keras.layers.Dropout(dropout_rate)
        drop_path = DropPath(drop_path_rate)
        if self._mlp_given:
            _check_given(mlp, MLP, "mlp", settings, dense_dtypes)
            mlp_layer = mlp
        else:
            mlp_layer = MLP(
                _required("mlp_dim", mlp_dim, "mlp"), kind=mlp,
                gelu_approximate=gelu_approximate, quick_gelu=quick_gelu,
                norm_epsilon=layer_norm_epsilon if mlp_norm else None, dropout=dropout,
                dense_dtypes={k: v for k, v in dense_dtypes.items() if k in MLP.DENSE_LAYERS},
                name="mlp",
            )
        # The settings, whoever made the sublayers, are theirs.
        self.num_heads = attention.num_heads
        self.attention_dropout_rate = attention.dropout_rate
        self.rope = attention.rope
        self.mlp_dim = mlp_layer.units
        self.mlp = mlp_layer.kind
        self.gelu_approximate = mlp_layer.gelu_approximate
        self.quick_gelu = mlp_layer.quick_gelu
        # The sublayers that hold variables are the block's attributes too, under the
        # names and in the order they have always had: a `.keras` file stores each
        # variable under the first public attribute path that reaches it (private ones
        # are visited last), and `model.variables` (hence optimizer states and run
        # backups) lists them in the order their layers were set. For that reason the
        # attention and the MLP themselves are private attributes.
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
        config = {
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
        }
        # A given sublayer is written whole in place of the settings that build one; its
        # quantized Dense layers are in its own config.
        built_here = []
        for key, layer, given in (
            ("attention", self._attention, self._attention_given),
            ("mlp", self._mlp, self._mlp_given),
        ):
            if not given:
                built_here.extend(layer.DENSE_LAYERS)
                continue
            for setting in SUBLAYER_SETTINGS[key]:
                config.pop(setting, None)
            config[key] = _serialize(layer)
        return {**config, **dense_dtypes_entry(self, built_here)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in SUBLAYER_SETTINGS:
            if isinstance(config.get(key), dict):
                config[key] = keras.saving.deserialize_keras_object(config[key])
        return super().from_config(config)


def _serialize(layer):
    # Without its build config: deserialized, it would be built on its own, outside the
    # block's name scope; the block builds it.
    serialized = keras.saving.serialize_keras_object(layer)
    return {key: value for key, value in serialized.items() if key != "build_config"}


def _required(name, value, sublayer):
    if value is None:
        raise ValueError(
            f"TransformerBlock needs {name}, or a ready-made {sublayer} layer "
            f"({sublayer}=...) instead of the settings that build one."
        )
    return value


def _check_given(layer, kind, key, settings, dense_dtypes):
    """Raises unless `layer`, given as the block's `key` sublayer, is an unbuilt `kind`
    given without the settings that would build one."""
    if not isinstance(layer, kind):
        choices = "'gelu', 'swiglu' or " if kind is MLP else ""
        raise ValueError(
            f"TransformerBlock's {key} must be {choices}a keras_vit.layers.{kind.__name__} "
            f"(or a subclass), got {type(layer).__name__}."
        )
    if layer.built:
        raise ValueError(
            f"TransformerBlock's {key} {layer.name!r} is already built: pass an unbuilt one; "
            "the block builds it, so that its variables are named in the block's scope."
        )
    conflicting = [
        name for name in SUBLAYER_SETTINGS[key]
        if settings[name] != SUBLAYER_SETTINGS[key][name]
    ] + [f"dense_dtypes[{name!r}]" for name in kind.DENSE_LAYERS if name in dense_dtypes]
    if conflicting:
        raise ValueError(
            f"TransformerBlock got a ready-made {key} layer and {', '.join(conflicting)}, "
            f"which would build one: set them on the {kind.__name__} instead."
        )
