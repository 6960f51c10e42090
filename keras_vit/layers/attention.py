"""Multi-head self-attention (`Attention`): a fused q|k|v projection, softmax attention
on the backend's fused kernel or as explicit products (in query blocks where that is
faster), optional rotary position embedding, and the output projection."""

import math

import keras
from keras import ops

from keras_vit.backend import products
from keras_vit.backend.attention import fused_attention_is_faster, qkv_attention
from keras_vit.backend.calls import call_sublayer
from keras_vit.backend.eager import split_last_axis
from keras_vit.backend.export import is_tracing_for_export
from keras_vit.layers.dense import Dense, dense_dtypes_entry
from keras_vit.layers.naflex import MASKED_LOGIT, mask_bias
from keras_vit.layers.rope import rotate
from keras_vit.utils.checks import check_positive_int
from keras_vit.utils.keras_compat import InParentNameScope
from keras_vit.utils.serialization import serializable

QUERY_BLOCK = 64


def query_blocks(length):
    """`(start, stop)` query rows that the softmax attention handles at a time.

    XLA:CPU under JAX fuses the softmax and both products of a head into one
    YNNPACK kernel, which slows down once the (queries x keys) tile outgrows the
    cache, so long sequences (ViT at 384 px) run in blocks of about `QUERY_BLOCK`
    queries. Short ones (224 px) are faster whole, and TensorFlow's XLA, which does
    not fuse these, gains nothing (bench/models.py; figures in the README's
    Performance section). Rows are independent, so blocking is exact.
    """
    # A length unknown when the graph is built (None, or a symbolic JAX dimension while
    # Keras infers the output shape of a `dynamic_image_size` model) is one block.
    if not isinstance(length, int) or length <= 4 * QUERY_BLOCK or keras.backend.backend() != "jax":
        return [(0, length)]
    count = -(-length // QUERY_BLOCK)
    size = -(-length // count)
    return [(start, min(start + size, length)) for start in range(0, length, size)]


@serializable
class Attention(InParentNameScope, keras.layers.Layer):
    """Multi-head self-attention: `attention_output(softmax(q k^T / sqrt(d)) v)`.

    The query, key and value projections are one fused Dense of width 3D (`qkv`: q | k
    | v, heads contiguous inside each), which maps exactly onto the official separate
    `(D, heads, head_dim)` kernels. Attention uses the backend's fused kernel
    (`keras_vit.backend.attention.qkv_attention`) where it has one (PyTorch;
    JAX on GPU and TPU) and batched matmuls under XLA on CPU and on TensorFlow, which
    are faster there. Under the mixed policies the logits and softmax are float32 on
    every path (the matmul path asks for float32 products of the queries and keys; the
    fused kernels accumulate in float32).

    It opens no name scope of its own: built inside a `TransformerBlock`, its variables
    are the block's (`block/qkv/kernel`), as its `Dense` layers are named.

    Args:
        num_heads: attention heads; must divide the width.
        dropout_rate: dropout on the attention weights.
        rope: the queries and keys are rotated by the rotary table passed as
            `call(x, rope=table)` (`keras_vit.layers.rope.rotate`).

    `call(x, token_mask=mask)` attends only to the keys whose float `(batch, tokens)`
    mask is 1: the padded tokens of a NaFlex batch (`keras_vit.layers.naflex`) take no
    part in any token's attention. A `(batch, tokens, tokens)` mask gives each query its
    own keys (a packed NaFlex row's `SlotMasks`: each image's tokens attend to their own).
        dense_dtypes: policies of the quantized Dense sublayers by name (`qkv`,
            `attention_output`), as `get_config` writes them after `model.quantize`.

    Returns:
        `(batch, tokens, width)`; with `call(..., return_attention=True)`,
        `(outputs, weights)`, the float32 weights `(batch, heads, tokens, tokens)`.

    Example:

    >>> attention = Attention(num_heads=4)
    >>> outputs, weights = attention(keras.random.uniform((2, 17, 32)), return_attention=True)
    >>> tuple(outputs.shape), tuple(weights.shape)
    ((2, 17, 32), (2, 4, 17, 17))
    """

    DENSE_LAYERS = ("qkv", "attention_output")

    def __init__(self, num_heads, dropout_rate=0.0, rope=False, dense_dtypes=None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.dropout_rate = float(dropout_rate)
        self.rope = bool(rope)
        self.dense_dtypes = dict(dense_dtypes or {})
        self.dropout = keras.layers.Dropout(dropout_rate)

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(
                f"hidden_dim {width} is not divisible by num_heads {self.num_heads}."
            )
        self.head_dim = width // self.num_heads
        self.qkv = Dense(3 * width, name="qkv", dtype=self.dense_dtypes.get("qkv"))
        self.attention_output = Dense(
            width, name="attention_output", dtype=self.dense_dtypes.get("attention_output")
        )
        for layer in (self.qkv, self.attention_output):
            layer.build(tuple(input_shape))

    def call(self, x, training=False, return_attention=False, rope=None, token_mask=None):
        if self.rope and rope is None:
            raise ValueError(
                f"{self.name} was built with rope=True and needs the rotary table: call it "
                "as layer(x, rope=table), the output of the model's rotary embedding."
            )
        out, weights = self._attend(
            x, training, return_attention, rope if self.rope else None, token_mask
        )
        return (out, weights) if return_attention else out

    def _attend(self, x, training, return_attention, rope, token_mask=None):
        qkv = split_last_axis(call_sublayer(self, self.qkv, x), (3, self.num_heads, self.head_dim))
        if rope is not None:  # queries and keys rotated by their patch's position
            q, k, v = (ops.squeeze(part, 2) for part in ops.split(qkv, 3, axis=2))
            qkv = ops.stack([rotate(q, rope), rotate(k, rope), v], axis=2)
        # Exporters map the explicit softmax to one op of their own.
        explicit = (
            return_attention
            or (training and self.dropout_rate > 0)
            or is_tracing_for_export()
        )
        # A padded or packed batch (NaFlex) keeps its padding and other images out by a
        # bias on the float32 logits: (batch, 1, 1, keys), or (batch, 1, queries, keys).
        bias = None if token_mask is None else mask_bias(token_mask)
        if not explicit and fused_attention_is_faster():
            mask = None if token_mask is None else bias > MASKED_LOGIT / 2
            return call_sublayer(self, self.attention_output, qkv_attention(qkv, mask)), None
        # One transpose of the fused q|k|v, then products batched over (batch, heads).
        # Split rather than unstacked: JAX differentiates unstack's slices by padding each
        # gradient to the size of q|k|v and adding them; split's gradient is one concatenation.
        q, k, v = (
            ops.squeeze(part, 0) for part in ops.split(ops.transpose(qkv, (2, 0, 3, 1, 4)), 3)
        )
        q = q * ops.cast(1.0 / math.sqrt(self.head_dim), q.dtype)
        if explicit:
            # Float32 logits under every policy: float16 products overflow past 65504,
            # bfloat16 ones keep 8 bits.
            logits = products.matmul_float32(q, k, transpose_x2=True)
            if bias is not None:
                logits = logits + bias
            weights = ops.softmax(logits, axis=-1)
            dropped = self.dropout(ops.cast(weights, v.dtype), training=training)
            out = products.matmul(dropped, v)
        else:
            weights = None
            pairs = bias is not None and len(token_mask.shape) == 3  # a bias per query
            blocks = [
                self._attend_rows(q[:, :, start:stop], k, v,
                                  bias[:, :, start:stop] if pairs else bias)
                for start, stop in query_blocks(x.shape[1])
            ]
            out = blocks[0] if len(blocks) == 1 else ops.concatenate(blocks, axis=2)
        out = products.swapaxes(out, 1, 2)  # a copy under XLA: see its docstring
        out = ops.reshape(out, (-1, ops.shape(x)[1], x.shape[-1]))
        out = call_sublayer(self, self.attention_output, out)
        return out, weights

    @staticmethod
    def _attend_rows(q, k, v, bias=None):
        # Logits in float32 (as in `_attend`). Softmax normalised after the product,
        # over (tokens, head_dim) values rather than (tokens, tokens); the shift
        # cancels, so it needs no gradient.
        logits = products.matmul_float32(q, k, transpose_x2=True)
        if bias is not None:
            logits = logits + bias
        exp = ops.exp(logits - ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True)))
        out = products.matmul_float32(ops.cast(exp, v.dtype), v)
        return ops.cast(out / ops.sum(exp, axis=-1, keepdims=True), v.dtype)

    def compute_output_spec(self, x, training=False, return_attention=False, rope=None,
                            token_mask=None):
        # From the shapes alone. Outputs are in the compute dtype (Keras casts the inputs
        # to it), the attention weights in float32.
        outputs = keras.KerasTensor(x.shape, self.compute_dtype)
        if not return_attention:
            return outputs
        batch, tokens = x.shape[0], x.shape[1]
        return outputs, keras.KerasTensor((batch, self.num_heads, tokens, tokens), "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "dropout_rate": self.dropout_rate,
            "rope": self.rope,
            **dense_dtypes_entry(self, self.DENSE_LAYERS),
        }
