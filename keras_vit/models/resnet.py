"""The BiT-style ResNet trunk of the paper's hybrid models.

As in the official `vit_jax/models_resnet.py`: weight-standardised convolutions,
GroupNorm with 32 groups, post-activation bottleneck units, and a root of a 7x7
stride-2 convolution followed by a 3x3 stride-2 max-pool.
"""

import dataclasses

import keras
from keras import ops

from keras_vit.backend.export import is_tracing_for_export
from keras_vit.utils.serialization import serializable

GROUPS = 32
GROUP_NORM_EPSILON = 1e-6  # flax.linen.GroupNorm's default
STANDARDIZE_EPSILON = 1e-5


def standardize_kernel(kernel, epsilon=STANDARDIZE_EPSILON):
    """Weight standardisation of an HWIO kernel: `(w - mean) / (std + epsilon)`.

    Mean and (population) standard deviation run over each output filter,
    i.e. the first three axes.

    Example:

    >>> w = standardize_kernel(keras.random.normal((3, 3, 4, 8)))
    >>> tuple(w.shape)
    (3, 3, 4, 8)
    """
    kernel = ops.convert_to_tensor(kernel)
    mean = ops.mean(kernel, axis=(0, 1, 2), keepdims=True)
    std = ops.std(kernel, axis=(0, 1, 2), keepdims=True)
    return (kernel - mean) / (std + epsilon)


@serializable
class StdConv2D(keras.layers.Conv2D):
    """`Conv2D` (no bias, `"same"` padding by default) with a weight-standardised kernel.

    Example:

    >>> conv = StdConv2D(16, 3, strides=2)
    >>> tuple(conv(keras.random.normal((1, 8, 8, 4))).shape)
    (1, 4, 4, 16)
    """

    def __init__(self, filters, kernel_size, strides=1, padding="same", use_bias=False, **kwargs):
        super().__init__(
            filters, kernel_size, strides=strides, padding=padding, use_bias=use_bias, **kwargs
        )

    def convolution_op(self, inputs, kernel):
        return super().convolution_op(inputs, standardize_kernel(kernel))


@serializable
class MaxPool2D(keras.layers.MaxPooling2D):
    """`MaxPooling2D` that exports everywhere.

    Under `keras_vit.backend.export.tracing_for_export()` it takes the maximum of
    the strided slices of the padded input, one per window offset, which equals the
    pooling exactly; jax2onnx turns JAX's NHWC window reduction into a 4-D ONNX
    MaxPool that onnxruntime refuses.

    Example:

    >>> from keras_vit.backend.export import tracing_for_export
    >>> x = keras.random.normal((1, 7, 6, 2))
    >>> pool = MaxPool2D(3, strides=2, padding="same")
    >>> with tracing_for_export():
    ...     sliced = pool(x)
    >>> bool(keras.ops.all(sliced == pool(x)))
    True
    """

    def call(self, inputs):
        if not is_tracing_for_export() or self.data_format != "channels_last":
            return super().call(inputs)
        (pool_h, pool_w), (stride_h, stride_w) = self.pool_size, self.strides
        _, height, width, _ = inputs.shape
        out_h, out_w, _ = self.compute_output_shape(inputs.shape)[1:]
        pads = []
        for size, out, pool, stride in (
            (height, out_h, pool_h, stride_h), (width, out_w, pool_w, stride_w)
        ):
            total = max((out - 1) * stride + pool - size, 0) if self.padding == "same" else 0
            pads.append((total // 2, total - total // 2))
        # Every window holds at least one input value, so the padding never wins.
        x = ops.pad(inputs, [(0, 0), *pads, (0, 0)], constant_values=float("-inf"))
        result = None
        for i in range(pool_h):
            for j in range(pool_w):
                rows = slice(i, i + (out_h - 1) * stride_h + 1, stride_h)
                cols = slice(j, j + (out_w - 1) * stride_w + 1, stride_w)
                window = x[:, rows, cols, :]
                result = window if result is None else ops.maximum(result, window)
        return result


def _build_pair(conv, norm, input_shape):
    shape = conv.compute_output_shape(tuple(input_shape))
    conv.build(tuple(input_shape))
    norm.build(shape)
    return shape


def _group_norm(name, gamma_initializer="ones"):
    return keras.layers.GroupNormalization(
        groups=GROUPS, epsilon=GROUP_NORM_EPSILON, gamma_initializer=gamma_initializer, name=name
    )


@serializable
class BottleneckUnit(keras.layers.Layer):
    """Post-activation bottleneck residual unit with 4x channel expansion.

    `relu(residual + gn3(conv3(relu(gn2(conv2(relu(gn1(conv1(x)))))))))`, where the
    residual is projected (1x1 conv + GroupNorm) when the shape changes. The last
    GroupNorm's scale starts at zero, so a new unit starts as its residual.

    Args:
        features: bottleneck width; the unit outputs `4 * features` channels.
        strides: stride of the 3x3 convolution (and of the projection).

    Example:

    >>> unit = BottleneckUnit(32, strides=2)
    >>> tuple(unit(keras.random.normal((1, 8, 8, 64))).shape)
    (1, 4, 4, 128)
    """

    def __init__(self, features, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        self.conv1 = StdConv2D(features, 1, name="conv1")
        self.gn1 = _group_norm("gn1")
        self.conv2 = StdConv2D(features, 3, strides=strides, name="conv2")
        self.gn2 = _group_norm("gn2")
        self.conv3 = StdConv2D(4 * features, 1, name="conv3")
        self.gn3 = _group_norm("gn3", gamma_initializer="zeros")

    def build(self, input_shape):
        self.needs_projection = input_shape[-1] != 4 * self.features or self.strides != 1
        if self.needs_projection:
            self.conv_proj = StdConv2D(4 * self.features, 1, strides=self.strides, name="conv_proj")
            self.gn_proj = _group_norm("gn_proj")
            _build_pair(self.conv_proj, self.gn_proj, input_shape)
        shape = _build_pair(self.conv1, self.gn1, input_shape)
        shape = _build_pair(self.conv2, self.gn2, shape)
        _build_pair(self.conv3, self.gn3, shape)

    def convolutions(self):
        """`{suffix: (conv, norm)}` for `"_proj"` (when the unit projects), `"1"`, `"2"`
        and `"3"`: the official checkpoints' `conv{suffix}` / `gn{suffix}` pairs."""
        pairs = {"_proj": (self.conv_proj, self.gn_proj)} if self.needs_projection else {}
        pairs.update({"1": (self.conv1, self.gn1), "2": (self.conv2, self.gn2),
                      "3": (self.conv3, self.gn3)})
        return pairs

    def kernels(self):
        """The unit's convolution kernels."""
        return tuple(conv.kernel for conv, _ in self.convolutions().values())

    def call(self, x):
        residual = self.gn_proj(self.conv_proj(x)) if self.needs_projection else x
        y = ops.relu(self.gn1(self.conv1(x)))
        y = ops.relu(self.gn2(self.conv2(y)))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        # Spares Keras tracing `call` for the shape on every symbolic call.
        return (*self.conv2.compute_output_shape(tuple(input_shape))[:-1], 4 * self.features)

    def get_config(self):
        return {**super().get_config(), "features": self.features, "strides": self.strides}


@dataclasses.dataclass(frozen=True)
class ResNetParts:
    """The layers of a hybrid's ResNet trunk (`resnet_trunk`), in the order they run.

    Attributes:
        root_conv: the 7x7 stride-2 `StdConv2D` of the root.
        root_norm: the root's `GroupNormalization`.
        stages: one tuple of `BottleneckUnit`s per stage (empty for the root alone).
    """

    root_conv: StdConv2D
    root_norm: keras.layers.GroupNormalization
    stages: tuple

    @property
    def layers(self):
        """The root convolution and norm, then every unit, stage by stage."""
        return (self.root_conv, self.root_norm, *(u for stage in self.stages for u in stage))

    def kernels(self):
        """Every convolution kernel of the trunk (root, then each unit's)."""
        units = (unit for stage in self.stages for unit in stage)
        return (self.root_conv.kernel, *(k for unit in units for k in unit.kernels()))


def resnet_trunk(images, stage_units, width=64):
    """Applies the hybrid's ResNet trunk to a symbolic image tensor.

    The root (7x7 stride-2 conv, GroupNorm, ReLU, 3x3 stride-2 max-pool) divides the
    resolution by 4; the first stage keeps it and each later stage halves it. Layer
    names follow the official checkpoints (`conv_root`, `gn_root`, `block{s}_unit{u}`),
    which `.keras` files address the weights by.

    Args:
        images: a `keras.Input` or symbolic tensor (batch, height, width, channels).
        stage_units: bottleneck units per stage, e.g. `(3, 4, 9)` for R50+B/16;
            `()` for the root alone (R+Ti/16).
        width: root width; stage `s` has bottleneck width `width * 2**s`.

    Returns:
        `(features, parts)`: the trunk's output and its `ResNetParts`.

    Example:

    >>> images = keras.Input((64, 64, 3))
    >>> features, parts = resnet_trunk(images, (1, 1))
    >>> tuple(features.shape), [len(stage) for stage in parts.stages]
    ((None, 8, 8, 512), [1, 1])
    """
    root_conv = StdConv2D(width, 7, strides=2, name="conv_root")
    root_norm = _group_norm("gn_root")
    x = keras.layers.ReLU(name="relu_root")(root_norm(root_conv(images)))
    x = MaxPool2D(3, strides=2, padding="same", name="root_pool")(x)
    stages = []
    for stage, units in enumerate(stage_units):
        stages.append([])
        for unit in range(units):
            strides = 2 if stage > 0 and unit == 0 else 1
            layer = BottleneckUnit(
                width * 2**stage, strides=strides, name=f"block{stage + 1}_unit{unit + 1}"
            )
            x = layer(x)
            stages[-1].append(layer)
    return x, ResNetParts(root_conv, root_norm, tuple(tuple(stage) for stage in stages))


def trunk_stride(stage_units):
    """Total downscaling of `resnet_trunk` with these stages: 4, times 2 per later stage."""
    return 4 * 2 ** max(len(stage_units) - 1, 0)
