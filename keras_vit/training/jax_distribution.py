"""`keras.distribution` layouts for ViT: data and model parallelism on the JAX backend.

`keras.distribution` is implemented for JAX; importing this module is safe with every
backend (nothing is placed until a distribution is set).
"""

import keras

from keras_vit.layers.block import TransformerBlock
from keras_vit.models.vit import BLOCK_NAME

# Megatron-style tensor parallelism: the first Dense of each of a block's projection
# pairs (TransformerBlock.PROJECTION_PAIRS) splits its output columns over the model
# axis, the second its input rows, so each block needs one all-reduce after attention
# and one after the MLP. Keys are regexes that Keras matches with re.search against
# the weights' paths, which the model's layer names make.
def _tensor_parallel_layout():
    blocks = BLOCK_NAME.format(index=r"\d+")
    layout = {}
    for wide, narrow in TransformerBlock.PROJECTION_PAIRS:
        layout[f"{blocks}/{wide}/kernel"] = (None, "model")
        layout[f"{blocks}/{wide}/bias"] = ("model",)
        layout[f"{blocks}/{narrow}/kernel"] = ("model", None)
    return layout


VIT_LAYOUT = _tensor_parallel_layout()


def layout_map(device_mesh):
    """A `keras.distribution.LayoutMap` sharding a ViT's attention and MLP kernels.

    `device_mesh` needs axes named `"batch"` and `"model"`; the `qkv` and `mlp_fc1`
    kernels (and biases) are split by columns over `"model"`, the `attention_output` and
    `mlp_fc2` kernels by rows; every other weight is replicated.

    Example:

    >>> mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"),
    ...                                      keras.distribution.list_devices()[:1])
    >>> layout_map(mesh)[r"encoderblock_\\d+/qkv/kernel"].axes
    (None, 'model')
    """
    if set(device_mesh.axis_names) != {"batch", "model"}:
        raise ValueError(
            f"The device mesh's axes must be named 'batch' and 'model', got "
            f"{tuple(device_mesh.axis_names)!r}."
        )
    layouts = keras.distribution.LayoutMap(device_mesh)
    for path, axes in VIT_LAYOUT.items():
        layouts[path] = axes
    return layouts


def model_parallel(model_shards, devices=None):
    """A `keras.distribution.ModelParallel` for ViT: `model_shards` devices per replica.

    The devices (default: all) form a `(len(devices) // model_shards, model_shards)`
    mesh; batches are split over the first axis, the large kernels over the second (see
    `layout_map`). The MLP width and `3 * hidden_dim` must divide by `model_shards`.
    Set it with `keras.distribution.set_distribution(...)` before building the model.

    Example:

    >>> distribution = model_parallel(1, keras.distribution.list_devices()[:1])
    >>> distribution.device_mesh.shape
    (1, 1)
    """
    devices = devices or keras.distribution.list_devices()
    if model_shards < 1 or len(devices) % model_shards:
        raise ValueError(
            f"model_shards must be a positive divisor of the {len(devices)} devices, "
            f"got {model_shards!r}."
        )
    mesh = keras.distribution.DeviceMesh(
        (len(devices) // model_shards, model_shards), ("batch", "model"), devices
    )
    return keras.distribution.ModelParallel(layout_map=layout_map(mesh), batch_dim_name="batch")


def fsdp_axes(shape, shards, axis="batch"):
    """The axes that shard a weight of `shape` over `shards` devices (FSDP): its largest
    dimension that `shards` divides, or none (replicated) when no dimension does.

    Example:

    >>> fsdp_axes((64, 192), 4)
    (None, 'batch')
    >>> fsdp_axes((10,), 4)
    (None,)
    """
    divisible = [d for d in range(len(shape)) if shape[d] % shards == 0]
    largest = max(divisible, key=lambda d: (shape[d], -d), default=None)
    return tuple(axis if d == largest else None for d in range(len(shape)))


class FullyShardedDataParallel(keras.distribution.ModelParallel):
    """Data parallelism with every weight sharded over the same devices (FSDP, as
    big_vision's `fsdp`): each device holds `1/N` of each weight (`fsdp_axes`; weights
    with no dimension that N divides stay whole), and so of the optimizer's slots, which
    Keras creates with their weights' layouts. XLA gathers a weight where a step uses it
    and reduce-scatters its gradient, so training computes what one device does. Set it
    with `keras.distribution.set_distribution(...)` before building the model.

    Args:
        devices: the devices (default: all, of every process); batches are split over them.
        auto_shard_dataset: as `keras.distribution.DataParallel`'s.

    Example:

    >>> distribution = FullyShardedDataParallel(keras.distribution.list_devices()[:1])
    >>> tuple(distribution.device_mesh.axis_names)
    ('batch',)
    """

    def __init__(self, devices=None, auto_shard_dataset=True):
        devices = devices or keras.distribution.list_devices()
        mesh = keras.distribution.DeviceMesh((len(devices),), ("batch",), devices)
        super().__init__(
            layout_map=keras.distribution.LayoutMap(mesh), batch_dim_name="batch",
            auto_shard_dataset=auto_shard_dataset,
        )

    def get_variable_layout(self, variable):
        if getattr(variable, "_layout", None) is not None:
            return variable._layout
        shards = self.device_mesh.shape[0]
        return keras.distribution.TensorLayout(fsdp_axes(variable.shape, shards), self.device_mesh)
