"""The Vision Transformer's building blocks as Keras layers.

Every layer uses `keras.ops` only, so it runs on the TensorFlow, JAX and PyTorch
backends. Weight layouts are chosen so that the official checkpoints map onto
them by reshapes alone (see `keras_vit.weights.pretrained`).
"""

import contextlib
import functools
import math

import keras
from keras import ops

from keras_vit.models import posembed
from keras_vit.utils import backend_ops
from keras_vit.utils.checks import check_choice, check_in_range, check_positive_int
from keras_vit.utils.serialization import serializable

POSITION_EMBEDDINGS = ("learned", "learned2d", "sincos2d", "none")
# The blocks' MLPs: the paper's GELU MLP, and the SwiGLU of DINOv2's giant model.
MLPS = ("gelu", "swiglu")


def _dense_dtypes_entry(layer, names):
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


def sincos_2d_table(grid_size, width, temperature=10000.0):
    """Fixed 2-D sine-cosine position table of shape `(1, rows * cols, width)`.

    As big_vision's `posemb_sincos_2d`: frequencies `temperature ** -(i / (width/4 - 1))`,
    channels `[sin(col), cos(col), sin(row), cos(row)]`.

    Example:

    >>> table = sincos_2d_table((4, 4), 32)
    >>> tuple(table.shape)
    (1, 16, 32)
    """
    rows, cols = grid_size
    if width % 4 or width < 8:
        raise ValueError(
            "pos_embedding='sincos2d' needs a width divisible by 4 and at least 8, "
            f"got hidden_dim={width}."
        )
    quarter = width // 4
    omega = 1.0 / temperature ** (ops.arange(quarter, dtype="float32") / (quarter - 1))
    y, x = ops.meshgrid(
        ops.arange(rows, dtype="float32"), ops.arange(cols, dtype="float32"), indexing="ij"
    )
    y = ops.reshape(y, (-1, 1)) * omega[None]
    x = ops.reshape(x, (-1, 1)) * omega[None]
    table = ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=1)
    return table[None]


# erf(x) = x * P(x^2) / Q(x^2) for |x| <= ERF_CLIP, and +-1 beyond, where float32
# rounds it to +-1 anyway. Fitted for this package by weighted least squares with
# Lawson reweighting towards the minimax fit on Chebyshev nodes: 1.4e-9 maximal
# error in exact arithmetic, 3e-7 when evaluated in float32, as XLA's own erf.
ERF_CLIP = 3.92
_ERF_P = (
    1.1283791807870855, 0.18470204003542848, 0.05427829350527862, 0.0038323929470468663,
    0.00038036490439347727, 4.7176154149366e-06, -1.3335082939410789e-08,
)
_ERF_Q = (
    1.0, 0.4970214493101046, 0.11377579631297821, 0.015430951654451401,
    0.0013050234227493269, 6.341723936241545e-05,
)


def _horner(coefficients, t):
    value = ops.cast(coefficients[-1], t.dtype)
    for coefficient in coefficients[-2::-1]:
        value = value * t + coefficient
    return value


@ops.custom_gradient
def erf(x):
    """The error function from multiplies, adds and one divide (float32 inside).

    Every XLA consumer loads it (unlike JAX's `lax.erf` composite, which jax2tf
    export cannot hand to TensorFlow) and XLA fuses it with its neighbours. The
    gradient is the closed form, which needs only `x` kept for the backward pass.

    Example:

    >>> round(float(erf(keras.ops.convert_to_tensor(0.5))), 6)
    0.5205
    """
    dtype = keras.backend.standardize_dtype(x.dtype)
    # 16-bit floats would round every Horner step; XLA's erf also upcasts them.
    x32 = ops.cast(x, "float32")
    clipped = ops.clip(x32, -ERF_CLIP, ERF_CLIP)
    t = clipped * clipped
    numerator, denominator = (_horner(coefficients, t) for coefficients in (_ERF_P, _ERF_Q))

    def grad(*args, upstream=None):
        upstream = args[0] if upstream is None else upstream
        slope = ops.exp(-x32 * x32) * (2.0 / math.sqrt(math.pi))
        return upstream * ops.cast(slope, dtype)

    return ops.cast(clipped * numerator / denominator, dtype), grad


@functools.cache
def _fused_attention_is_faster():
    """Whether `backend_ops.dot_product_attention` beats explicit products on this machine.

    It runs fused kernels on PyTorch (CPU and GPU) and, on JAX, on GPUs and TPUs
    (cuDNN or Pallas flash attention); on TensorFlow and on a JAX CPU it is two
    einsums, slower than the batched matmuls of `TransformerBlock` (measured with
    bench/models.py).
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return True
    if backend == "jax":
        return not keras.distribution.list_devices()[0].startswith("cpu")
    return False


_EXPORT_TRACING = []


@contextlib.contextmanager
def tracing_for_export():
    """Within it, layers trace the forms that every exporter follows.

    Exporters (jax2onnx, tf2onnx, torch.onnx, the LiteRT converter) each accept
    a subset of the backends' operations; a layer whose fastest form falls outside
    one of them traces an equal form built from basic operations instead, inside
    this context only, so training and inference keep their fast paths.

    Example:

    >>> with tracing_for_export():
    ...     is_tracing_for_export()
    True
    >>> is_tracing_for_export()
    False
    """
    _EXPORT_TRACING.append(True)
    try:
        yield
    finally:
        _EXPORT_TRACING.pop()


def is_tracing_for_export():
    """Whether the caller runs inside `tracing_for_export()` or a TorchScript trace.

    Keras' own ONNX export on PyTorch (`model.export(path, format="onnx")` with a
    variable batch size) traces the model with TorchScript, so a model exported that
    way outside the context takes the export forms too.
    """
    if _EXPORT_TRACING:
        return True
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.jit.is_tracing()


def _moments(x, axes, epsilon):
    """`x`'s mean over `axes`, `x` centred, and the reciprocal of its deviation."""
    mean = ops.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    return mean, centred, ops.rsqrt(ops.mean(ops.square(centred), axis=axes, keepdims=True) + epsilon)


def _normalize(x, gamma, beta, epsilon, dtype):
    """Layer normalisation over the last axis, in float32, keeping for the backward
    pass only `x` and each row's mean and reciprocal deviation: differentiating
    the formula instead keeps three tensors of `x`'s size."""

    @ops.custom_gradient
    def normalize(x, gamma, beta):
        mean, centred, rstd = _moments(ops.cast(x, "float32"), [-1], epsilon)

        def grad(*args, upstream=None):
            upstream = ops.cast(args[0] if upstream is None else upstream, "float32")
            normalized = (ops.cast(x, "float32") - mean) * rstd
            rows = tuple(range(len(x.shape) - 1))
            scaled = upstream * gamma
            dx = rstd * (
                scaled
                - ops.mean(scaled, axis=-1, keepdims=True)
                - normalized * ops.mean(scaled * normalized, axis=-1, keepdims=True)
            )
            return (
                ops.cast(dx, x.dtype),
                ops.sum(upstream * normalized, axis=rows),
                ops.sum(upstream, axis=rows),
            )

        return ops.cast(centred * rstd * gamma + beta, dtype), grad

    return normalize(x, ops.cast(gamma, "float32"), ops.cast(beta, "float32"))


@serializable
class LayerNormalization(keras.layers.LayerNormalization):
    """`LayerNormalization` that exports everywhere and trains in less memory on JAX.

    When training under JAX its gradient is the closed form, computed from the inputs
    and each row's statistics, which XLA keeps instead of three tensors of the
    inputs' size (docs/performance.md: the memory of a training step).

    When `is_tracing_for_export()` it normalises with means, a subtraction and a
    reciprocal square root, in float32 as Keras does. On PyTorch Keras calls the fused
    `layer_norm` kernel with the normalised shape read from the input; Keras' ONNX
    exporter traces a variable batch size with TorchScript, which records those sizes
    as values of the traced input and then refuses them as the kernel's shape.
    It keeps Keras' class name: a `.keras` file stores a model's layers under their
    class names, so the files written with Keras' layer load into this one.

    Args:
        Those of `keras.layers.LayerNormalization`.

    Returns:
        The normalised inputs, in the layer's compute dtype.

    Example:

    >>> x = keras.random.normal((2, 5, 8))
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> with tracing_for_export():
    ...     traced = norm(x)
    >>> bool(keras.ops.max(keras.ops.abs(traced - norm(x))) < 1e-5)
    True
    """

    def call(self, inputs, training=None):
        rank = len(inputs.shape)
        last_axis_only = [axis % rank for axis in self.axis] == [rank - 1]
        if (
            training  # at inference XLA keeps more buffers around the custom gradient
            # TensorFlow's XLA step and PyTorch's fused kernel need no more memory with
            # Keras' formula (docs/performance.md).
            and keras.backend.backend() == "jax"
            and last_axis_only
            and self.scale
            and self.center
            and not self.rms_scaling
        ):
            return _normalize(inputs, self.gamma, self.beta, self.epsilon, self.compute_dtype)
        if not is_tracing_for_export() or self.rms_scaling:
            return super().call(inputs)
        x = ops.cast(inputs, "float32")
        rank = len(x.shape)
        axes = sorted(axis % rank for axis in self.axis)
        _, centred, rstd = _moments(x, axes, self.epsilon)
        x = centred * rstd
        for weight, combine in ((self.gamma, ops.multiply), (self.beta, ops.add)):
            if weight is not None:  # scale=False, center=False leave them out
                shape = [1] * rank
                for axis, size in zip(axes, weight.shape):
                    shape[axis] = size
                x = combine(x, ops.reshape(ops.cast(weight, "float32"), shape))
        return ops.cast(x, self.compute_dtype)


QUERY_BLOCK = 64


def _query_blocks(length):
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
class Dense(keras.layers.Dense):
    """`keras.layers.Dense` whose 16-bit products reach XLA:CPU's bfloat16 kernels.

    The product and bias are `keras_vit.utils.backend_ops.dense`: the numbers of
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
        x = backend_ops.dense(inputs, self.kernel, self.bias)
        return x if self.activation is None else self.activation(x)

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras quantizes subclasses of Dense only when asked not to check the type,
        # since their `call` may differ; a quantized layer runs Dense's own
        # `quantized_call`, never this `call`.
        super().quantize(mode, type_check=False, config=config)


@serializable
class Patches(keras.layers.Layer):
    """Cuts images into non-overlapping square patches.

    Maps `(batch, height, width, channels)` to `(batch, num_patches, P * P * channels)`.
    Patches are in row-major order and each is flattened in (row, column, channel)
    order, so a patch-embedding conv kernel of shape `(P, P, C, D)` becomes the
    projection matrix by `reshape(P * P * C, D)`.

    Args:
        patch_size: side length P of a patch, in pixels.
        flatten: False keeps the patch grid: `(batch, rows, cols, P * P * channels)`,
            what `PatchEncoder` takes from images whose size is known only at run time.

    Example:

    >>> images = keras.random.uniform((2, 32, 48, 3))
    >>> tuple(Patches(8)(images).shape), tuple(Patches(8, flatten=False)(images).shape)
    ((2, 24, 192), (2, 4, 6, 192))
    """

    def __init__(self, patch_size, flatten=True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = check_positive_int("patch_size", patch_size)
        self.flatten = bool(flatten)

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"Patches expects images of shape (batch, height, width, channels), "
                f"got shape {tuple(input_shape)}."
            )
        _, height, width, channels = input_shape
        for side, size in (("height", height), ("width", width)):
            if size is not None and size % self.patch_size:
                raise ValueError(
                    f"Image {side} {size} is not divisible by patch_size {self.patch_size}: "
                    f"use an image size that is a multiple of {self.patch_size}."
                )
        self.channels = channels

    def call(self, images):
        shape = ops.shape(images)
        if images.shape[-1] != self.channels:
            raise ValueError(
                f"Expected images with {self.channels} channels (NHWC), got "
                f"{images.shape[-1]} channels in shape {tuple(images.shape)}."
            )
        p = self.patch_size
        for side, size in (("height", shape[1]), ("width", shape[2])):
            if isinstance(size, int) and size % p:
                raise ValueError(
                    f"Image {side} {size} is not divisible by patch_size {p}: use an image "
                    f"size that is a multiple of {p}, or a model built with "
                    "dynamic_image_pad=True."
                )
        rows, cols = shape[1] // p, shape[2] // p
        x = ops.reshape(images, (-1, rows, p, cols, p, self.channels))
        x = ops.transpose(x, (0, 1, 3, 2, 4, 5))
        if self.flatten:
            return ops.reshape(x, (-1, rows * cols, p * p * self.channels))
        return ops.reshape(x, (-1, rows, cols, p * p * self.channels))

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        p = self.patch_size
        rows = None if height is None else height // p
        cols = None if width is None else width // p
        if not self.flatten:
            return (batch, rows, cols, p * p * channels)
        return (batch, None if rows is None or cols is None else rows * cols, p * p * channels)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size, "flatten": self.flatten}


@serializable
class PadToMultiple(keras.layers.Layer):
    """Pads images with zeros at the bottom and the right to a multiple of a size.

    As timm's `dynamic_img_pad`: a `dynamic_image_pad=True` model takes images of any
    size, and its patches cover the padded image.

    Args:
        multiple: the height and width become multiples of it (the patch size, times
            a hybrid trunk's stride).

    Example:

    >>> tuple(PadToMultiple(8)(keras.ops.ones((1, 30, 17, 3))).shape)
    (1, 32, 24, 3)
    """

    def __init__(self, multiple, **kwargs):
        super().__init__(**kwargs)
        self.multiple = check_positive_int("multiple", multiple)

    def call(self, images):
        shape = ops.shape(images)
        m = self.multiple
        pads = [(0, 0), (0, (m - shape[1] % m) % m), (0, (m - shape[2] % m) % m), (0, 0)]
        return ops.pad(images, pads)

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        m = self.multiple
        return (batch, *(None if s is None else -(-s // m) * m for s in (height, width)), channels)

    def get_config(self):
        return {**super().get_config(), "multiple": self.multiple}


@serializable
class PatchEncoder(keras.layers.Layer):
    """Projects flattened patches to `hidden_dim` and adds position embeddings.

    It takes patches of its grid `(batch, rows * cols, features)`, or a patch grid of
    any size `(batch, rows, cols, features)` (`Patches(flatten=False)`, rows and cols
    possibly known only at run time), to which the position table is resampled in the
    graph (`position_table(grid)`): `"sincos2d"` is computed for that grid. Either way it
    returns `(batch, patches, hidden_dim)` tokens in row-major order.

    Args:
        hidden_dim: width D of the token embeddings.
        grid_size: `(rows, cols)` of the patch grid (an int means a square grid): the
            grid of the learned tables.
        pos_embedding: `"learned"` (the paper's 1-D table, default), `"learned2d"`
            (row and column tables of D/2 each, concatenated), `"sincos2d"`
            (fixed), or `"none"`.
        interpolation: how a learned table is resampled to another grid (see
            `keras_vit.models.posembed`): `"bicubic_antialias"`, `"bilinear_align_corners"`
            or `"bicubic"`.
        dense_dtypes: `{"projection": policy}` once quantized (written
            by `get_config` after `model.quantize`); None builds it with the default policy.
        use_bias: False leaves the bias out of the patch embedding (CLIP's convolution
            has none).

    The position table covers the patches only; the class token's row lives in
    `ClassToken`, so resolution changes resample a pure patch grid.

    Example:

    >>> patches = keras.random.uniform((2, 16, 48))
    >>> tuple(PatchEncoder(32, grid_size=4)(patches).shape)
    (2, 16, 32)
    >>> tuple(PatchEncoder(32, grid_size=4)(keras.random.uniform((2, 3, 5, 48))).shape)
    (2, 15, 32)
    """

    def __init__(
        self, hidden_dim, grid_size, pos_embedding="learned", interpolation="bicubic_antialias",
        dense_dtypes=None, use_bias=True, **kwargs
    ):
        super().__init__(**kwargs)
        dense_dtypes = dense_dtypes or {}
        check_choice("pos_embedding", pos_embedding, POSITION_EMBEDDINGS)
        posembed.check_interpolation(interpolation)
        if isinstance(grid_size, int):
            grid_size = (grid_size, grid_size)
        self.hidden_dim = int(hidden_dim)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.pos_embedding = pos_embedding
        self.interpolation = interpolation
        if pos_embedding == "learned2d" and self.hidden_dim % 2:
            raise ValueError(
                f"pos_embedding='learned2d' needs an even width, got hidden_dim={hidden_dim}."
            )
        if pos_embedding == "sincos2d":
            # Validates the width now rather than at the first call.
            sincos_2d_table(self.grid_size, self.hidden_dim)
        self.use_bias = bool(use_bias)
        self.projection = Dense(
            self.hidden_dim, use_bias=self.use_bias, name="projection",
            dtype=dense_dtypes.get("projection"),
        )

    def build(self, input_shape):
        rows, cols = self.grid_size
        if len(input_shape) == 3 and input_shape[1] not in (None, rows * cols):
            raise ValueError(
                f"PatchEncoder with grid_size {self.grid_size} expects {rows * cols} "
                f"patches, got {input_shape[1]}."
            )
        self.projection.build(input_shape)
        init = keras.initializers.RandomNormal(stddev=0.02)
        if self.pos_embedding == "learned":
            self.position = self.add_weight(
                name="position", shape=(1, rows * cols, self.hidden_dim), initializer=init
            )
        elif self.pos_embedding == "learned2d":
            half = self.hidden_dim // 2
            self.row_position = self.add_weight(
                name="row_position", shape=(rows, 1, half), initializer=init
            )
            self.col_position = self.add_weight(
                name="col_position", shape=(1, cols, half), initializer=init
            )

    def position_table(self, grid=None):
        """The `(1, rows * cols, hidden_dim)` table added to the patches, or None.

        Args:
            grid: `(rows, cols)` of the patches, ints or scalar integer tensors; the
                learned tables are resampled to it with `interpolation` (per axis for
                `"learned2d"`). None (or `grid_size`) gives the tables as they are.
        """
        rows, cols = self.grid_size if grid is None else grid
        if self.pos_embedding == "learned":
            if grid is None:
                return self.position
            table = ops.reshape(self.position, (*self.grid_size, self.hidden_dim))
            table = posembed.resample_position_tensor(table, (rows, cols), self.interpolation)
            return ops.reshape(table, (1, rows * cols, self.hidden_dim))
        if self.pos_embedding == "learned2d":
            half = self.hidden_dim // 2
            resample = posembed.resample_position_tensor
            row_table = resample(self.row_position, (rows, 1), self.interpolation)
            col_table = resample(self.col_position, (1, cols), self.interpolation)
            table = ops.concatenate(
                [
                    ops.broadcast_to(row_table, (rows, cols, half)),
                    ops.broadcast_to(col_table, (rows, cols, half)),
                ],
                axis=-1,
            )
            return ops.reshape(table, (1, rows * cols, self.hidden_dim))
        if self.pos_embedding == "sincos2d":
            return sincos_2d_table((rows, cols), self.hidden_dim)
        return None

    def call(self, patches):
        x = self.projection(patches)
        grid = None
        if len(patches.shape) == 4:
            shape = ops.shape(patches)
            grid = (shape[1], shape[2])
            x = ops.reshape(x, (-1, grid[0] * grid[1], self.hidden_dim))
        table = self.position_table(grid)
        if table is None:
            return x
        return x + ops.cast(table, x.dtype)

    def compute_output_shape(self, input_shape):
        if len(input_shape) == 4:
            batch, rows, cols = input_shape[:3]
            return (batch, None if rows is None or cols is None else rows * cols, self.hidden_dim)
        return (*input_shape[:-1], self.hidden_dim)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_dim": self.hidden_dim,
            "grid_size": self.grid_size,
            "pos_embedding": self.pos_embedding,
            "interpolation": self.interpolation,
            **_dense_dtypes_entry(self, ("projection",)),
            # Only when off: the configs of the models with a bias stay as they were.
            **({} if self.use_bias else {"use_bias": False}),
        }


@serializable
class ClassToken(keras.layers.Layer):
    """Prepends a learned class token (zero-initialised) to a token sequence.

    Args:
        use_position: also learn the class token's own position-embedding row
            (initialised like the position table). The official checkpoints'
            position table has this row as its first; storing it here keeps the
            exact parameter count while the patch table stays a pure grid.
        num_tokens: how many learned tokens it prepends (1; DINOv2's registers: 4).

    Example:

    >>> tokens = keras.random.uniform((2, 16, 32))
    >>> tuple(ClassToken()(tokens).shape), tuple(ClassToken(num_tokens=4)(tokens).shape)
    ((2, 17, 32), (2, 20, 32))
    """

    def __init__(self, use_position=False, num_tokens=1, **kwargs):
        super().__init__(**kwargs)
        self.use_position = bool(use_position)
        self.num_tokens = check_positive_int("num_tokens", num_tokens)

    def build(self, input_shape):
        width = input_shape[-1]
        shape = (1, self.num_tokens, width)
        self.token = self.add_weight(name="token", shape=shape, initializer="zeros")
        if self.use_position:
            self.position = self.add_weight(
                name="position",
                shape=shape,
                initializer=keras.initializers.RandomNormal(stddev=0.02),
            )

    def call(self, tokens):
        token = self.token + self.position if self.use_position else self.token
        token = ops.cast(token, tokens.dtype)
        token = ops.broadcast_to(
            token, (ops.shape(tokens)[0], self.num_tokens, tokens.shape[-1])
        )
        return ops.concatenate([token, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        batch, length, width = input_shape
        return (batch, None if length is None else length + self.num_tokens, width)

    def get_config(self):
        # `num_tokens` only when set: the configs of the class tokens stay as they were.
        count = {} if self.num_tokens == 1 else {"num_tokens": self.num_tokens}
        return {**super().get_config(), "use_position": self.use_position, **count}


@serializable
class TokenPooling(keras.layers.Layer):
    """Pools encoder output tokens: `"token"` takes one (the first, or the one at
    `index`), `"gap"` averages those from `index` on (all by default), `"distilled"`
    averages the first two (DeiT's class and distillation tokens, as timm's
    `pre_logits`), `"token_gap"` concatenates the
    first with the mean of the tokens from `index` on (the patches: HF's
    `Dinov2ForImageClassification`), twice the width.

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

    def call(self, tokens):
        if self.classifier == "token":
            return tokens[:, self.index]
        if self.classifier == "distilled":
            return (tokens[:, 0] + tokens[:, 1]) / 2
        if self.classifier == "token_gap":
            patches = ops.mean(tokens[:, self.index:], axis=1)
            return ops.concatenate([tokens[:, 0], patches], axis=-1)
        return ops.mean(tokens[:, self.index:], axis=1)

    def compute_output_shape(self, input_shape):
        width = input_shape[2] * (2 if self.classifier == "token_gap" else 1)
        return (input_shape[0], width)

    def get_config(self):
        # `index` only when set: the configs of the paper's models stay as they were.
        return {
            **super().get_config(),
            "classifier": self.classifier,
            **({"index": self.index} if self.index else {}),
        }


@serializable
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops a residual branch per sample with probability `rate`.

    Kept samples are scaled by `1 / (1 - rate)`, so the expected output is unchanged.

    Example:

    >>> x = keras.ops.ones((4, 3, 8))
    >>> bool(keras.ops.all(DropPath(0.5)(x, training=False) == x))
    True
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        check_in_range("DropPath rate", rate, "[0, 1)")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def call(self, x, training=False):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = keras.random.uniform(shape, seed=self.seed_generator, dtype=x.dtype) < keep
        return x * ops.cast(mask, x.dtype) / keep

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}


@serializable
class RotaryEmbedding(keras.layers.Layer):
    """EVA-02's 2-D rotary position embedding: the sines and cosines each attention
    rotates its patch queries and keys by (timm's `RotaryEmbeddingCat` with
    `in_pixels=False`, applied by `apply_rot_embed_cat`).

    The head width is split in two halves, one for the patch's row and one for its
    column, each with `head_dim // 4` frequencies `temperature ** (-i / (head_dim // 4))`,
    each repeated for an interleaved pair of channels. With `reference_grid`, the row
    and column indices are scaled to that grid (`index / rows * reference_rows`), as
    EVA-02 serves other image sizes than it was trained at. The tokens in front of the
    patches get no rotation: rows of sine 0 and cosine 1.

    Args:
        head_dim: the attention head width, a multiple of 4.
        grid_size: `(rows, cols)` of the patch grid when the patches come flattened.
        reference_grid: `(rows, cols)` the positions are scaled to (timm's
            `ref_feat_shape`), or None for the grid's own indices.
        num_prefix_tokens: the tokens in front of the patches (class token, ...).
        temperature: the frequency base.

    Returns:
        From the patches `(batch, rows, cols, C)` (or flattened, with `grid_size`), the
        float32 table `(prefix + rows * cols, 2 * head_dim)`: sines, then cosines.

    Example:

    >>> rope = RotaryEmbedding(8, grid_size=(2, 3), num_prefix_tokens=1)
    >>> tuple(rope(keras.ops.zeros((1, 6, 12))).shape)
    (7, 16)
    """

    def __init__(self, head_dim, grid_size, reference_grid=None, num_prefix_tokens=0,
                 temperature=10000.0, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("head_dim", head_dim)
        if head_dim % 4:
            raise ValueError(
                f"rope=True needs a head width (hidden_dim / num_heads) that is a multiple "
                f"of 4, got {head_dim}: change hidden_dim or num_heads."
            )
        self.head_dim = int(head_dim)
        self.grid_size = tuple(grid_size)
        self.reference_grid = None if reference_grid is None else tuple(reference_grid)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.temperature = float(temperature)

    def call(self, patches):
        if len(patches.shape) == 4:  # a dynamic model's patch grid
            rows, cols = ops.shape(patches)[1], ops.shape(patches)[2]
        else:
            rows, cols = self.grid_size
        bands = self.head_dim // 4
        # arange(0, n): jax2onnx (JAX ONNX export) takes no arange(n) with stop None.
        exponents = ops.arange(0, bands, dtype="float32") / bands
        frequencies = 1.0 / ops.power(ops.cast(self.temperature, "float32"), exponents)
        axes = []
        for size, reference in zip((rows, cols), self.reference_grid or (None, None)):
            index = ops.arange(0, size, dtype="float32")
            if reference is not None:  # timm's order: index / size * reference
                index = index / ops.cast(size, "float32") * reference
            axes.append(index[:, None] * frequencies)  # (size, bands)
        # Row-major grid: the row's angles, then the column's, for each patch.
        angles = ops.concatenate([
            ops.repeat(axes[0][:, None, :], cols, axis=1),
            ops.repeat(axes[1][None, :, :], rows, axis=0),
        ], axis=-1)
        angles = ops.repeat(ops.reshape(angles, (-1, 2 * bands)), 2, axis=-1)
        table = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
        prefix = ops.concatenate([
            ops.zeros((self.num_prefix_tokens, self.head_dim)),
            ops.ones((self.num_prefix_tokens, self.head_dim)),
        ], axis=-1)
        return ops.concatenate([prefix, table], axis=0)

    def compute_output_spec(self, patches):
        patches_count = None
        if len(patches.shape) != 4:
            patches_count = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        return keras.KerasTensor((patches_count, 2 * self.head_dim), "float32")

    def get_config(self):
        return {
            **super().get_config(),
            "head_dim": self.head_dim,
            "grid_size": self.grid_size,
            "reference_grid": self.reference_grid,
            "num_prefix_tokens": self.num_prefix_tokens,
            "temperature": self.temperature,
        }


def rotate(x, table):
    """`x` (`(..., tokens, heads, head_dim)`) rotated by a `RotaryEmbedding` table
    (`(tokens, 2 * head_dim)`): `x * cos + rot(x) * sin`, `rot` turning each
    interleaved channel pair `(a, b)` into `(-b, a)` (timm's `apply_rot_embed_cat`)."""
    sin, cos = (ops.cast(t[:, None, :], x.dtype) for t in ops.split(table, 2, axis=-1))
    pairs = ops.reshape(x, (*ops.shape(x)[:-1], -1, 2))
    turned = ops.reshape(ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), ops.shape(x))
    return x * cos + turned * sin


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
        return keras.activations.gelu(y, approximate=approximate)
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


@serializable
class TransformerBlock(keras.layers.Layer):
    """Pre-LayerNorm Transformer encoder block.

    `x = x + DropPath(Dropout(Attention(LN(x))))`, then
    `x = x + DropPath(MLP(LN(x)))` with `MLP = Dense(mlp_dim) -> GELU -> Dropout
    -> Dense(D) -> Dropout`.

    The query, key and value projections are one fused Dense of width 3D (q | k | v,
    heads contiguous inside each), which maps exactly onto the official separate
    `(D, heads, head_dim)` kernels. Attention uses the backend's fused kernel
    (`keras_vit.utils.backend_ops.dot_product_attention`) where it has one (PyTorch;
    JAX on GPU and TPU) and batched matmuls under XLA on CPU and on TensorFlow, which are faster
    there; `call(..., return_attention=True)` returns `(outputs, weights)` with
    weights of shape `(batch, heads, tokens, tokens)`. Under the mixed policies the
    attention logits and softmax are float32 on every path (the matmul path asks for
    float32 products of the queries and keys; the fused kernels accumulate in float32), as
    are the LayerNorm statistics (Keras computes them in float32).

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
        rope: EVA-02's rotary position embedding: the queries and keys are rotated by
            the `RotaryEmbedding` table passed as `call(x, rope=table)` (`rotate`).
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
    PROJECTION_PAIRS = (("qkv", "attention_output"), ("mlp_fc1", "mlp_fc2"))
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
        check_choice("mlp", mlp, MLPS)
        self.mlp = mlp
        self.rope = bool(rope)
        self.mlp_norm = (
            LayerNormalization(epsilon=layer_norm_epsilon, name="mlp_norm") if mlp_norm else None
        )
        self.dense_dtypes = dict(dense_dtypes or {})
        self.quick_gelu = bool(quick_gelu)
        self.layer_scale_init = None if layer_scale_init is None else float(layer_scale_init)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.drop_path_rate = float(drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)

        self.norm1 = LayerNormalization(epsilon=layer_norm_epsilon, name="norm1")
        self.norm2 = LayerNormalization(epsilon=layer_norm_epsilon, name="norm2")
        self.attention_dropout = keras.layers.Dropout(attention_dropout_rate)
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.drop_path = DropPath(drop_path_rate)
        self.mlp_fc1 = self._dense(mlp_dim * (2 if mlp == "swiglu" else 1), "mlp_fc1")

    def build(self, input_shape):
        width = input_shape[-1]
        if width % self.num_heads:
            raise ValueError(
                f"hidden_dim {width} is not divisible by num_heads {self.num_heads}."
            )
        self.head_dim = width // self.num_heads
        self.qkv = self._dense(3 * width, "qkv")
        self.attention_output = self._dense(width, "attention_output")
        self.mlp_fc2 = self._dense(width, "mlp_fc2")
        token_shape = tuple(input_shape)
        for layer in (self.norm1, self.norm2, self.qkv, self.attention_output):
            layer.build(token_shape)
        self.mlp_fc1.build(token_shape)
        self.mlp_fc2.build((*token_shape[:-1], self.mlp_dim))
        if self.mlp_norm is not None:
            self.mlp_norm.build((*token_shape[:-1], self.mlp_dim))
        self.layer_scales = ()
        if self.layer_scale_init is not None:
            init = keras.initializers.Constant(self.layer_scale_init)
            self.layer_scales = tuple(
                self.add_weight(name=name, shape=(width,), initializer=init)
                for name in ("layer_scale_attention", "layer_scale_mlp")
            )
        # `call` skips DropPath at inference, and `model.quantize` refuses unbuilt layers
        # (Keras' Dropout builds itself at construction).
        self.drop_path.build(token_shape)

    def projections(self):
        """The block's `Dense` layers, in `PROJECTION_PAIRS` order: `qkv`,
        `attention_output`, `mlp_fc1`, `mlp_fc2` (the block must be built)."""
        return (self.qkv, self.attention_output, self.mlp_fc1, self.mlp_fc2)

    def _dense(self, units, name):
        return Dense(units, name=name, dtype=self.dense_dtypes.get(name))

    def _attend(self, x, training, return_attention, rope=None):
        length, width = ops.shape(x)[1], x.shape[-1]
        qkv = ops.reshape(self._apply(self.qkv, x), (-1, length, 3, self.num_heads, self.head_dim))
        if rope is not None:  # queries and keys rotated by their patch's position
            q, k, v = (ops.squeeze(part, 2) for part in ops.split(qkv, 3, axis=2))
            qkv = ops.stack([rotate(q, rope), rotate(k, rope), v], axis=2)
        # Exporters map the explicit softmax to one op of their own.
        explicit = (
            return_attention
            or (training and self.attention_dropout_rate > 0)
            or is_tracing_for_export()
        )
        if not explicit and _fused_attention_is_faster():
            # Split, not indexed: the gradient of three indexed slices is three zero
            # tensors of q|k|v's size, each written into and summed (PyTorch; JAX pads
            # and adds); split's is one concatenation. The squeezed parts are strided
            # views, which PyTorch's fused kernel reads in place.
            q, k, v = (ops.squeeze(part, 2) for part in ops.split(qkv, 3, axis=2))
            out = backend_ops.dot_product_attention(q, k, v)
            return self._apply(self.attention_output, ops.reshape(out, (-1, length, width))), None
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
            logits = backend_ops.matmul_float32(q, k, transpose_x2=True)
            weights = ops.softmax(logits, axis=-1)
            dropped = self.attention_dropout(ops.cast(weights, v.dtype), training=training)
            out = backend_ops.matmul(dropped, v)
        else:
            weights = None
            blocks = [
                self._attend_rows(q[:, :, start:stop], k, v)
                for start, stop in _query_blocks(x.shape[1])
            ]
            out = blocks[0] if len(blocks) == 1 else ops.concatenate(blocks, axis=2)
        out = backend_ops.swapaxes(out, 1, 2)  # a copy under XLA: see its docstring
        out = self._apply(self.attention_output, ops.reshape(out, (-1, length, width)))
        return out, weights

    @staticmethod
    def _attend_rows(q, k, v):
        # Logits in float32 (as in `_attend`). Softmax normalised after the product,
        # over (tokens, head_dim) values rather than (tokens, tokens); the shift
        # cancels, so it needs no gradient.
        logits = backend_ops.matmul_float32(q, k, transpose_x2=True)
        exp = ops.exp(logits - ops.stop_gradient(ops.max(logits, axis=-1, keepdims=True)))
        out = backend_ops.matmul_float32(ops.cast(exp, v.dtype), v)
        return ops.cast(out / ops.sum(exp, axis=-1, keepdims=True), v.dtype)

    def _apply(self, layer, x):
        # On PyTorch each Keras layer call costs Python time (`Layer.__call__`: input
        # conversion, autocast and name scopes, the call context) that an eager step
        # spends every time, and that a GPU waits on (bench/gpu_profile.json). Within this
        # block's call the inputs are in its compute dtype under its autocast scope, so a
        # built sublayer of the same dtype policy computes the same numbers through `call`.
        # A quantized sublayer has another policy and runs Keras' `quantized_call`.
        if (
            keras.backend.backend() == "torch"
            and layer.built
            and layer.dtype_policy.name == self.dtype_policy.name
        ):
            return layer.call(x)
        return layer(x)

    def _gelu(self, y):
        return mlp_activation(y, self.gelu_approximate, self.quick_gelu)

    @staticmethod
    def _swiglu(y):
        # The packed halves of timm's SwiGLUPacked and DINOv2's `w12`: the gate first.
        gate, up = ops.split(y, 2, axis=-1)
        return ops.silu(gate) * up

    def _regularise(self, y, training, *layers):
        # Calls only the layers that change `y`: at inference, or at rate 0, Dropout and
        # DropPath return it unchanged, and each Keras layer call costs Python time that
        # eager backends (PyTorch) spend on every step.
        for layer in layers:
            if training and layer.rate > 0:
                y = layer(y, training=training)
        return y

    def _scale(self, y, branch):
        # Layer scale multiplies each residual branch before it is added (timm's LayerScale).
        if not self.layer_scales:
            return y
        return y * ops.cast(self.layer_scales[branch], y.dtype)

    def call(self, x, training=False, return_attention=False, rope=None):
        if self.rope and rope is None:
            raise ValueError(
                f"{self.name} was built with rope=True and needs the rotary table: call it "
                "as block(x, rope=table), the output of the model's RotaryEmbedding."
            )
        attended, weights = self._attend(
            self._apply(self.norm1, x), training, return_attention, rope if self.rope else None
        )
        attended = self._scale(attended, 0)
        x = x + self._regularise(attended, training, self.dropout, self.drop_path)
        y = self._apply(self.mlp_fc1, self._apply(self.norm2, x))
        y = self._swiglu(y) if self.mlp == "swiglu" else self._gelu(y)
        y = self._regularise(y, training, self.dropout)
        if self.mlp_norm is not None:
            y = self._apply(self.mlp_norm, y)
        y = self._apply(self.mlp_fc2, y)
        y = self._scale(self._regularise(y, training, self.dropout), 1)
        x = x + self._regularise(y, training, self.drop_path)
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

    def compute_output_spec(self, x, training=False, return_attention=False, rope=None):
        # From the shapes alone: Keras would otherwise trace `call` on every symbolic
        # call, most of the time it takes to build a model. Outputs are in the compute
        # dtype (Keras casts the inputs to it), the attention weights in float32.
        outputs = keras.KerasTensor(x.shape, self.compute_dtype)
        if not return_attention:
            return outputs
        batch, tokens = x.shape[0], x.shape[1]
        return outputs, keras.KerasTensor((batch, self.num_heads, tokens, tokens), "float32")

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
            **_dense_dtypes_entry(self, self.DENSE_LAYERS),
        }


@serializable
class MAPHead(keras.layers.Layer):
    """Multi-head attention pooling (big_vision's `MAPHead`, SigLIP's pooling).

    A learned probe token attends over all the tokens, then a residual MLP on its
    LayerNorm: `x = Attention(probe, tokens)`, `x = x + MLP(LN(x))`, and `x[:, 0]` is
    returned, as HF's `SiglipMultiheadAttentionPoolingHead` and timm's
    `AttentionPoolLatent` compute it.

    Args:
        num_heads: attention heads; must divide the width.
        mlp_dim: hidden width of the MLP.
        layer_norm_epsilon: epsilon of the LayerNorm.
        gelu_approximate, quick_gelu: the MLP's activation (see `mlp_activation`).
        dense_dtypes: policies of the quantized Dense sublayers by name (written
            by `get_config` after `model.quantize`).

    Returns:
        `(batch, width)` pooled features.

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
                            ("attention_output", width), ("mlp_fc1", self.mlp_dim),
                            ("mlp_fc2", width)):
            setattr(self, name, Dense(units, name=name, dtype=self.dense_dtypes.get(name)))
        token_shape = tuple(input_shape)
        probe_shape = (token_shape[0], 1, width)
        self.key_value.build(token_shape)
        for layer in (self.query, self.attention_output, self.norm, self.mlp_fc1):
            layer.build(probe_shape)
        self.mlp_fc2.build((token_shape[0], 1, self.mlp_dim))

    def projections(self):
        """The head's `Dense` layers (`DENSE_LAYERS` order)."""
        return tuple(getattr(self, name) for name in self.DENSE_LAYERS)

    def call(self, tokens, return_attention=False):
        """Pools `tokens`; with `return_attention`, also returns the probe's float32
        attention over them, `(batch, heads, tokens)` (where the model looks)."""
        length, width = ops.shape(tokens)[1], tokens.shape[-1]
        probe = ops.cast(self.probe, tokens.dtype)
        query = ops.reshape(self.query(probe), (1, 1, self.num_heads, self.head_dim))
        query = ops.transpose(query, (0, 2, 1, 3)) * ops.cast(1.0 / math.sqrt(self.head_dim),
                                                              tokens.dtype)
        kv = ops.reshape(self.key_value(tokens), (-1, length, 2, self.num_heads, self.head_dim))
        key, value = (ops.squeeze(part, 0) for part in ops.split(ops.transpose(kv, (2, 0, 3, 1, 4)), 2))
        # Float32 logits under every policy, as in `TransformerBlock`.
        logits = backend_ops.matmul_float32(
            ops.broadcast_to(query, (ops.shape(tokens)[0], self.num_heads, 1, self.head_dim)),
            key, transpose_x2=True,
        )
        attention = ops.softmax(logits, axis=-1)
        weights = ops.cast(attention, value.dtype)
        out = ops.reshape(ops.transpose(backend_ops.matmul(weights, value), (0, 2, 1, 3)),
                          (-1, 1, width))
        x = self.attention_output(out)
        y = mlp_activation(self.mlp_fc1(self.norm(x)), self.gelu_approximate, self.quick_gelu)
        pooled = (x + self.mlp_fc2(y))[:, 0]
        if return_attention:
            return pooled, ops.cast(attention[:, :, 0], "float32")
        return pooled

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "quick_gelu": self.quick_gelu,
            **_dense_dtypes_entry(self, self.DENSE_LAYERS),
        }
