"""Pooling the encoder's tokens into one feature vector: by token or mean (`TokenPooling`),
or by attention (`MAPHead`)."""

import math

import keras
from keras import ops

from keras_vit.backend import products
from keras_vit.backend.calls import call_sublayer
from keras_vit.backend.eager import split_last_axis
from keras_vit.layers.dense import Dense, dense_dtypes_entry
from keras_vit.layers.mlp import MLP
from keras_vit.layers.naflex import after_first, mask_bias, masked_mean, nth_of_rows
from keras_vit.layers.normalization import LayerNormalization
from keras_vit.utils.checks import check_choice, check_positive_int
from keras_vit.utils.serialization import serializable


@serializable
class TokenPooling(keras.layers.Layer):
    """Pools encoder output tokens: `"token"` takes one (the first, or the one at
    `index`), `"gap"` averages those from `index` on (all by default), `"distilled"`
    averages the first two (DeiT's class and distillation tokens, as timm's
    `pre_logits`), `"token_gap"` concatenates the
    first with the mean of the tokens from `index` on (the patches: HF's
    `Dinov2ForImageClassification`), twice the width. `call(tokens, token_mask=mask)`
    averages only the tokens whose `(batch, tokens)` mask is 1 (a NaFlex batch's real
    patches). Given a mask of rows `(batch, K, tokens)` (a packed NaFlex row's slots,
    `keras_vit.layers.naflex.SlotMasks`), it pools each row's tokens as the sequence
    alone, `index` counting within the row: `(batch, K, width)`.

    Example:

    >>> tuple(TokenPooling("gap")(keras.random.uniform((2, 16, 32))).shape)
    (2, 32)
    >>> tuple(TokenPooling("token_gap", index=1)(keras.random.uniform((2, 17, 32))).shape)
    (2, 64)
    """

    def __init__(self, classifier="token", index=0, **kwargs):
        super().__init__(**kwargs)
        check_choice("classifier", classifier, ("token", "gap", "distilled", "token_gap"))
        self.classifier = classifier
        self.index = int(index)

    def call(self, tokens, token_mask=None):
        rows = token_mask is not None and len(token_mask.shape) == 3

        def token(n):  # the n-th token of the sequence, or of each row
            return nth_of_rows(tokens, token_mask, n) if rows else tokens[:, n]

        if self.classifier == "token":
            return token(self.index)
        if self.classifier == "distilled":
            return (token(0) + token(1)) / 2
        if rows:
            patches = masked_mean(tokens, after_first(token_mask, self.index))
        elif token_mask is None:
            patches = ops.mean(tokens[:, self.index:], axis=1)
        else:
            patches = masked_mean(tokens[:, self.index:], token_mask[:, self.index:])
        if self.classifier == "token_gap":
            return ops.concatenate([token(0), patches], axis=-1)
        return patches

    def compute_output_shape(self, tokens_shape, token_mask_shape=None):
        width = tokens_shape[2] * (2 if self.classifier == "token_gap" else 1)
        if token_mask_shape is not None and len(token_mask_shape) == 3:
            return (tokens_shape[0], token_mask_shape[1], width)
        return (tokens_shape[0], width)

    def get_config(self):
        # `index` only when set: the configs of the paper's models stay as they were.
        return {
            **super().get_config(),
            "classifier": self.classifier,
            **({"index": self.index} if self.index else {}),
        }


@serializable
class MAPHead(keras.layers.Layer):
    """Multi-head attention pooling (big_vision's `MAPHead`, SigLIP's pooling).

    A learned probe token attends over all the tokens, then a residual `MLP` on its
    LayerNorm: `x = Attention(probe, tokens)`, `x = x + MLP(LN(x))`, and `x[:, 0]` is
    returned, as HF's `SiglipMultiheadAttentionPoolingHead` and timm's
    `AttentionPoolLatent` compute it.

    Args:
        num_heads: attention heads; must divide the width.
        mlp_dim: hidden width of the MLP.
        layer_norm_epsilon: epsilon of the LayerNorm.
        gelu_approximate, quick_gelu: the MLP's activation (see
            `keras_vit.layers.mlp.mlp_activation`).
        dense_dtypes: policies of the quantized Dense sublayers by name (written
            by `get_config` after `model.quantize`).

    Returns:
        `(batch, width)` pooled features; with a mask of rows `(batch, K, tokens)`
        (`call(tokens, token_mask=rows)`, a packed NaFlex row's slots), the probe pools
        each row's tokens alone: `(batch, K, width)`.

    Example:

    >>> head = MAPHead(num_heads=4, mlp_dim=64)
    >>> tuple(head(keras.random.uniform((2, 16, 32))).shape)
    (2, 32)
    """

    DENSE_LAYERS = ("query", "key_value", "attention_output", "mlp_fc1", "mlp_fc2")

    def __init__(self, num_heads, mlp_dim, layer_norm_epsilon=1e-6, gelu_approximate=False,
                 quick_gelu=False, dense_dtypes=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.quick_gelu = bool(quick_gelu)
        self.dense_dtypes = dict(dense_dtypes or {})
        self.norm = LayerNormalization(epsilon=self.layer_norm_epsilon, name="norm")

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(f"hidden_dim {width} is not divisible by num_heads {self.num_heads}.")
        self.head_dim = width // self.num_heads
        self.probe = self.add_weight(
            name="probe", shape=(1, 1, width), initializer=keras.initializers.RandomNormal(stddev=0.02)
        )
        # The probe's query, and the tokens' keys and values (k | v, heads contiguous).
        for name, units in (("query", width), ("key_value", 2 * width),
                            ("attention_output", width)):
            setattr(self, name, Dense(units, name=name, dtype=self.dense_dtypes.get(name)))
        mlp = MLP(
            self.mlp_dim, gelu_approximate=self.gelu_approximate, quick_gelu=self.quick_gelu,
            dense_dtypes={k: v for k, v in self.dense_dtypes.items() if k in MLP.DENSE_LAYERS},
            name="mlp",
        )
        token_shape = tuple(input_shape)
        probe_shape = (token_shape[0], 1, width)
        self.key_value.build(token_shape)
        for layer in (self.query, self.attention_output, self.norm, mlp):
            layer.build(probe_shape)
        # The MLP's Dense layers are the head's attributes under their names of always,
        # set after it (as in `TransformerBlock`): a `.keras` file stores each variable
        # under the first public attribute path that reaches it.
        self._mlp = mlp
        self.mlp_fc1, self.mlp_fc2 = mlp.mlp_fc1, mlp.mlp_fc2

    def projections(self):
        """The head's `Dense` layers (`DENSE_LAYERS` order)."""
        return tuple(getattr(self, name) for name in self.DENSE_LAYERS)

    def call(self, tokens, return_attention=False, token_mask=None):
        """Pools `tokens`; with `return_attention`, also returns the probe's float32
        attention over them, `(batch, heads, tokens)` (where the model looks). With a
        `token_mask` `(batch, tokens)` the probe attends only to the tokens where it is
        1 (HF's `key_padding_mask`: a NaFlex batch's real patches); with a mask of rows
        `(batch, K, tokens)`, once per row, the attention `(batch, heads, K, tokens)`."""
        width = tokens.shape[-1]
        rows = token_mask is not None and len(token_mask.shape) == 3
        queries = token_mask.shape[1] if rows else 1
        probe = ops.cast(self.probe, tokens.dtype)
        heads = (self.num_heads, self.head_dim)
        query = split_last_axis(call_sublayer(self, self.query, probe), heads)
        query = ops.transpose(query, (0, 2, 1, 3)) * ops.cast(1.0 / math.sqrt(self.head_dim),
                                                              tokens.dtype)
        kv = split_last_axis(call_sublayer(self, self.key_value, tokens), (2, *heads))
        key, value = (ops.squeeze(part, 0) for part in ops.split(ops.transpose(kv, (2, 0, 3, 1, 4)), 2))
        # Float32 logits under every policy, as in `Attention`.
        logits = products.matmul_float32(
            ops.broadcast_to(query, (ops.shape(tokens)[0], self.num_heads, queries, self.head_dim)),
            key, transpose_x2=True,
        )
        if token_mask is not None:
            logits = logits + mask_bias(token_mask)
        attention = ops.softmax(logits, axis=-1)
        weights = ops.cast(attention, value.dtype)
        out = ops.reshape(ops.transpose(products.matmul(weights, value), (0, 2, 1, 3)),
                          (-1, queries, width))
        x = call_sublayer(self, self.attention_output, out)
        pooled = x + call_sublayer(self, self._mlp, call_sublayer(self, self.norm, x))
        pooled, attention = (pooled, attention) if rows else (pooled[:, 0], attention[:, :, 0])
        if return_attention:
            return pooled, ops.cast(attention, "float32")
        return pooled

    def compute_output_shape(self, tokens_shape, token_mask_shape=None):
        if token_mask_shape is not None and len(token_mask_shape) == 3:
            return (tokens_shape[0], token_mask_shape[1], tokens_shape[-1])
        return (tokens_shape[0], tokens_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "quick_gelu": self.quick_gelu,
            **dense_dtypes_entry(self, self.DENSE_LAYERS),
        }
