"""The Vision Transformer model (`VisionTransformer`), its paper variants and its declared
structure.

`VisionTransformer(...)` is a functional `keras.Model` built from its architecture arguments,
checked as one `keras_vit.models.architecture.Architecture`, which its `get_config` keeps
(`keras_vit.ViT`, in `keras_vit.weights.factory`, builds one
and loads pretrained weights into it); `model.parts` (`ViTParts`) names its layers by
role for every module that works on a model's weights or intermediate outputs.
"""

import contextlib
import dataclasses
import difflib
from typing import Optional

import keras
from keras import ops

from keras_vit import layers as vit_layers
from keras_vit.backend.calls import call_sublayer
from keras_vit.models import resnet, size
from keras_vit.models.architecture import CLASS_TOKEN_CLASSIFIERS, Architecture, input_stride
from keras_vit.models.preprocessing import DEFAULT, check_preprocessing, normalize
# The paper's variants, which `ViT` names (`parse_variant` read from here too).
from keras_vit.models.variants import VARIANTS, parse_variant  # noqa: F401
from keras_vit.utils import keras_compat
from keras_vit.utils.serialization import serializable

# The blocks' layer names: `.keras` files and the JAX layouts address their weights by them.
BLOCK_NAME = "encoderblock_{index}"


@dataclasses.dataclass(frozen=True)
class ViTParts:
    """The parts of a `keras_vit.ViT`, as the layers that hold them, in the order an
    image meets them.

    Every consumer of a model's structure (checkpoint loading and saving, MPP, the
    analyses, few-shot features, export, weight decay) reads it here, from
    `model.parts` or `vit_parts(model)`, rather than finding layers by name.

    Attributes:
        stem: a hybrid's ResNet trunk (`keras_vit.models.resnet.ResNetParts`), or None.
        patches: the `Patches` layer, cutting the images (a hybrid: the trunk's
            feature map) into flattened patches; a NaFlex model's `NaFlexPatches`,
            placing each of its patches in its image's grid (a packed model's
            `PackedNaFlexPatches`, in its slot's image's grid).
        patch_encoder: the `PatchEncoder`: the patch embedding (`patch_embedding`)
            and the position table (`position_table()`).
        class_token: the `ClassToken` of a `classifier="token"` (or `"token_gap"`)
            model, or None (`"gap"`, `"map"`).
        distillation_token: the `ClassToken` holding DeiT's distillation token, which
            follows the class token (`distilled=True`), or None.
        dropout: the `Dropout` applied to the embedded tokens.
        blocks: the `TransformerBlock`s, in depth order.
        norm: the final `LayerNormalization` of the encoder.
        pool: the `TokenPooling`, the `MAPHead` of a `classifier="map"` model, or None
            (`include_top=False, pooling=False`).
        pre_logits: the representation `Dense` (tanh), or None.
        head: the classification `Dense`, or None (`include_top=False`).
        head_dist: DeiT's distillation head `Dense` on the distillation token, whose
            logits are averaged with the head's, or None.
        registers: the `ClassToken` holding the register tokens (`num_registers`),
            after the class (and distillation) token, or None.
        pre_norm: the `LayerNormalization` before the blocks (CLIP's), or None.
        projection: the bias-free `Dense` from the pooled features to a shared
            image-text embedding (CLIP's `visual_projection`), or None.
        rope: the rotary embedding layer whose table every block's attention applies
            (EVA-02's `RotaryEmbedding`, or the layer that the `rope` argument names),
            or None.

    Example:

    >>> model = VisionTransformer(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                           num_heads=4, mlp_dim=64, num_classes=10)
    >>> parts = model.parts
    >>> len(parts.blocks), parts.grid_size, tuple(parts.patch_embedding.kernel.shape)
    (2, (4, 4), (192, 32))
    """

    stem: Optional[resnet.ResNetParts]
    patches: vit_layers.Patches
    patch_encoder: vit_layers.PatchEncoder
    class_token: Optional[vit_layers.ClassToken]
    dropout: keras.layers.Dropout
    blocks: tuple
    norm: keras.layers.LayerNormalization
    pool: Optional[vit_layers.TokenPooling]
    pre_logits: Optional[keras.layers.Dense]
    head: Optional[keras.layers.Dense]
    distillation_token: Optional[vit_layers.ClassToken] = None
    head_dist: Optional[keras.layers.Dense] = None
    registers: Optional[vit_layers.ClassToken] = None
    pre_norm: Optional[keras.layers.LayerNormalization] = None
    projection: Optional[keras.layers.Dense] = None
    rope: Optional[keras.layers.Layer] = None

    @property
    def patch_embedding(self):
        """The `Dense` projecting flattened patches, kernel `(P * P * C, D)`."""
        return self.patch_encoder.projection

    @property
    def grid_size(self):
        """The `(rows, cols)` patch grid (of the position table's image size)."""
        return self.patch_encoder.grid_size

    @property
    def stride(self):
        """The input pixels per patch side (`input_stride`)."""
        stages = None if self.stem is None else tuple(len(stage) for stage in self.stem.stages)
        return input_stride(self.patches.patch_size, stages)

    @property
    def image_size(self):
        """The `(height, width)` the position table is for: the input size of a model
        built without `dynamic_image_size`."""
        return tuple(side * self.stride for side in self.grid_size)

    def position_table(self):
        """The `(1, rows * cols, D)` table added to the patch embeddings, or None."""
        return self.patch_encoder.position_table()

    @property
    def prefix_tokens(self):
        """The `ClassToken`s whose tokens stand in front of the patches, in token
        order: the class token, then a distillation token, then the registers."""
        tokens = (self.class_token, self.distillation_token, self.registers)
        return tuple(t for t in tokens if t is not None)

    @property
    def num_prefix_tokens(self):
        """How many tokens stand in front of the patches (timm's `num_prefix_tokens`):
        what the patch maps, attention maps and patch-token pooling leave out."""
        return sum(token.num_tokens for token in self.prefix_tokens)

    @property
    def heads(self):
        """The classification `Dense` layers: the head, and DeiT's `head_dist`."""
        return tuple(head for head in (self.head, self.head_dist) if head is not None)

    @property
    def encoder(self):
        """The layers from the embedded patches to the final norm, in calling order:
        the tokens put in front of the patches (the distillation token, then the
        class token, each prepended), the dropout, `pre_norm`, the blocks, the norm."""
        pre_norm = () if self.pre_norm is None else (self.pre_norm,)
        return (*self.prefix_tokens[::-1], self.dropout, *pre_norm, *self.blocks, self.norm)

    def kernels(self):
        """The matrix kernels (what weight decay applies to): the trunk's convolutions,
        the patch embedding, each block's four projections, a `MAPHead`'s, `pre_logits`,
        `projection` and the heads."""
        kernels = list(self.stem.kernels()) if self.stem is not None else []
        kernels.append(self.patch_embedding.kernel)
        for block in self.blocks:
            kernels.extend(layer.kernel for layer in block.projections())
        if isinstance(self.pool, vit_layers.MAPHead):
            kernels.extend(layer.kernel for layer in self.pool.projections())
        kernels.extend(
            layer.kernel for layer in (self.pre_logits, self.projection, *self.heads)
            if layer is not None
        )
        return tuple(kernels)


def vit_parts(model):
    """The `ViTParts` of a `keras_vit.ViT`, or of a model built around one that
    declares them (`keras_vit.TrainingModel`; `MaskedPatchPrediction` gives its
    encoder's).

    Raises a `ValueError` naming the model when it declares no ViT parts.

    Example:

    >>> model = VisionTransformer(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                           num_heads=4, mlp_dim=64)
    >>> vit_parts(model) is model.parts
    True
    """
    parts = getattr(model, "parts", None)
    if not isinstance(parts, ViTParts):
        name = getattr(model, "name", None)
        raise ValueError(
            f"Model {name!r} ({type(model).__name__}) is not a keras_vit.ViT and declares "
            "no ViT parts: build it with keras_vit.ViT(...), or load a .keras file saved "
            "from one."
        )
    return parts


def default_image_size(model):
    """The `(height, width)` tools bring images to for `model` (a `keras_vit.ViT`): its
    input size, or for a `dynamic_image_size` model the size its position table is for.

    Example:

    >>> model = VisionTransformer(image_size=(32, 48), patch_size=8, hidden_dim=32, num_layers=1,
    ...                           num_heads=4, mlp_dim=64, dynamic_image_size=True)
    >>> model.input_shape, default_image_size(model)
    ((None, None, None, 3), (32, 48))
    """
    _, height, width, _ = model.input_shape
    if height is None or width is None:
        return vit_parts(model).image_size
    return height, width


@serializable
class VisionTransformer(keras_compat.AutoJitCompileHook, keras.Model):
    """The Vision Transformer: a functional `keras.Model` built from its architecture.

    `keras_vit.ViT(...)` builds one (and loads pretrained `weights`). The model maps NHWC
    images scaled to [-1, 1] (see `preprocess`) to logits. It declares its structure:
    `get_config()` returns the architecture arguments below, checked and normalised as
    one `Architecture` (`model.architecture`; `from_config` builds the model again from
    them), and `model.parts` gives its layers as a `ViTParts`.

    `compile`'s default `jit_compile="auto"` (also what an uncompiled model's
    `predict` uses) means XLA for `fit`, `evaluate` and `predict` on TensorFlow also
    on a machine with only a CPU, where Keras would turn it off, because keras-vit
    runs faster with it there (see bench/models.py). Under a `tf.distribute`
    strategy and on JAX, "auto" means what Keras decides; `jit_compile=False` turns XLA
    off. On PyTorch "auto" means eager steps; `jit_compile=True` runs them through
    `torch.compile`, which traces the model whole (no graph break; the training step
    breaks only at Keras' `loss.backward()`) and, with
    `dynamic_image_size`, compiles once more for a second image size and then takes any
    size: it removes the Python of each layer call from every step, but costs a compile
    per model and mode that is long on a CPU, and again for a new batch size, so it is
    asked for, not picked (docs/performance.md).

    Args:
        variant: a paper variant `"{Ti,S,B,L,H}/{8,14,16,32}"`, e.g. `"B/16"`, or a
            hybrid: `"R+Ti/16"`, `"R26+S/32"`, `"R26+B/32"`, `"R50+B/16"`, `"R50+L/32"`.
            Without it, `patch_size`, `hidden_dim`, `num_layers`, `num_heads` and
            `mlp_dim` describe a custom model; given with a variant they override it.
        resnet_stages: bottleneck units per stage of a ResNet trunk in front of the
            patch embedding (a custom hybrid), e.g. `(3, 4, 9)`; `()` for the root only.
        image_size: int or `(height, width)`, a multiple of the patch size; with
            `dynamic_image_size`, the size the position table is trained at.
        dynamic_image_size: True builds a model that takes images of any height and
            width that are multiples of the patch size (of the patch size times a hybrid
            trunk's stride), input shape `(None, None, None, channels)`: the position
            table is resampled in the graph to the input's patch grid with
            `pos_interpolation` (timm's `dynamic_img_size=True`, HF's
            `interpolate_pos_encoding=True`). The output at a size equals that of a model
            built at that size with the weights loaded by `load_pretrained(...,
            interpolation=pos_interpolation)`.
        dynamic_image_pad: with `dynamic_image_size`, images of any size are padded
            with zeros at the bottom and the right to the next multiple of the patch
            size (times a hybrid trunk's stride), as timm's `dynamic_img_pad=True`.
        pos_interpolation: how `dynamic_image_size` resamples the learned position
            table: `"bicubic_antialias"` (timm's), `"bilinear_align_corners"` (vit_jax's)
            or `"bicubic"` (HF's `Dinov2Model`; see `keras_vit.layers.posembed`).
        num_classes: width of the (zero-initialised) classification head.
        classifier: `"token"` (class token), `"gap"` (no class token, the mean of the
            patch tokens), `"token_gap"` (a class token concatenated with the mean of the
            patch tokens, registers left out: HF's `Dinov2ForImageClassification`) or
            `"map"` (no class token, attention pooling by a learned probe: the `MAPHead`
            of SigLIP and big_vision's `pool_type="map"`, timm's `class_token=False,
            global_pool="map"`) or `"avg"` (a class token, pooled by the mean of the
            patch tokens, the prefix tokens left out: timm's `global_pool="avg"`,
            EVA-02's classifiers).
        representation_size: width of the `pre_logits` Dense + tanh, or None.
        pos_embedding: `"learned"`, `"learned2d"`, `"sincos2d"` or `"none"`.
        dropout_rate, attention_dropout_rate, drop_path_rate: regularisation;
            the drop-path rate grows linearly from 0 to this value with depth.
        gelu_approximate: tanh GELU as the official JAX code (default exact GELU).
        include_top: False returns the pooled features (after `pre_logits`).
        pooling: with `include_top=False`, False returns every output token.
        channels: image channels.
        head_bias_init: initial head bias (the paper uses -10 with sigmoid loss).
        distilled: DeiT's distillation token, after the class token (with its own
            position row), and its own head `head_dist`: the logits are the mean of the
            two heads' (timm's `VisionTransformerDistilled` at inference, HF's
            `DeiTForImageClassificationWithTeacher`), and `include_top=False` pools the
            mean of the two tokens (timm's `pre_logits`). Needs `classifier="token"`.
        distillation_head: with `distilled`, False keeps the distillation token but
            classifies (and pools) the class token alone, as HF's
            `DeiTForImageClassification`.
        no_embed_class: the class (and distillation) tokens get no position
            embedding: the table covers the patches only (timm's `no_embed_class`,
            DeiT III and big_vision).
        layer_scale_init: None, or the initial value of per-channel scales on each
            block's residual branches (DeiT III, timm's `init_values`: 1e-6).
        layer_norm_epsilon: the epsilon of every LayerNorm (1e-6 as vit_jax and timm;
            HF's DeiT and ViT configs default to 1e-12).
        num_registers: learned register tokens after the class (and distillation)
            token, without position embedding (Darcet et al. 2023; DINOv2 with
            registers: 4; timm's `reg_tokens`). They take part in attention only: the
            pooling, feature maps and attention maps leave them out. Needs
            `classifier="token"`.
        mlp: the blocks' MLP: `"gelu"` (the paper's) or `"swiglu"` (DINOv2's giant
            model: `silu(gate) * up` of a `Dense(2 * mlp_dim)`, then `Dense(D)`; see
            `TransformerBlock`).
        pre_norm: a LayerNorm on the embedded tokens before the blocks (CLIP's
            `pre_layrnorm`, timm's `pre_norm=True`).
        quick_gelu: the MLPs use CLIP's quick GELU, `x * sigmoid(1.702 x)` (HF's
            `quick_gelu`, timm's `act_layer="quick_gelu"`), not GELU.
        patch_bias: False leaves the bias out of the patch embedding (CLIP's).
        projection_dim: None, or the width of a bias-free `Dense` after the pooling
            and `pre_logits` (CLIP's `visual_projection`): with `include_top=False` the
            model outputs CLIP's `image_embeds`.
        rope: a 2-D rotary position embedding in every attention, on the patch
            tokens' queries and keys, besides the position table. True is EVA-02's
            (timm's `use_rot_pos_emb=True`; `keras_vit.layers.rope.RotaryEmbedding`);
            a layer config, `keras.saving.serialize_keras_object(layer)`, names
            another: a registered layer whose constructor takes `head_dim`,
            `grid_size` and `num_prefix_tokens` (the model fills them in, with its
            name) and whose `call(patches)` returns the `(tokens, 2 * head_dim)`
            sines | cosines that `keras_vit.layers.rope.rotate` applies (in a
            `naflex` model `call(patches, token_grid)`, each image's:
            `(batch, tokens, 2 * head_dim)`).
        rope_reference_grid: with `rope`, the `(rows, cols)` patch grid the rotary
            positions are scaled to at every image size (timm's `ref_feat_shape`;
            EVA-02: `(16, 16)`), or None for the grid's own indices.
        mlp_norm: a LayerNorm inside each MLP, before its last Dense (EVA-02's
            base and large models: timm's `scale_mlp=True`).
        fc_norm: the final LayerNorm normalises the pooled features rather than the
            tokens (timm's `fc_norm`, on by default with `global_pool="avg"`, as in
            EVA-02); `pooling=False` still outputs the normalised tokens.
        naflex: the model takes NaFlex inputs (SigLIP 2's native resolution, HF's
            `Siglip2VisionModel`): a dict of `patches` `(batch, tokens, P * P *
            channels)`, images of any sizes each cut into its own patch grid and padded
            to one token count, `patch_mask` `(batch, tokens)` (1: a real patch) and
            `spatial_shapes` `(batch, 2)` (each image's patch rows and columns), as
            `keras_vit.naflex_inputs` makes them. The position table (of `image_size`'s
            grid) is resampled to each image's grid with `pos_interpolation` (SigLIP 2:
            `"bilinear_antialias"`; `"learned2d"`: its row and column tables, NaViT's
            factorised embeddings); padded tokens take no part in attention or pooling.
        images_per_row: with `naflex`, K images per row (NaViT's packing, Dehghani et
            al. 2023), or None (one: HF's layout). The row's images' patches come one
            image after another, then padding; `patch_mask` gives each token's slot (k
            in 1..K for the row's k-th image, 0 for padding) and `spatial_shapes` is
            `(batch, K, 2)` ((0, 0) for an empty slot). Each slot gets its own prefix
            tokens (the same variables), its tokens attend only to its own and it is
            pooled alone: the model returns `(batch, K, num_classes)` (without the top,
            `(batch, K, features)`), each slot's what the unpacked model with the same
            weights gives on that image alone, and finite values for an empty slot.
        remat: rematerialise each transformer block (`keras.RematScope`): training
            keeps only the blocks' inputs for the backward pass and recomputes the rest,
            less memory for more compute, the same numbers (big_vision's `remat`).
        data_format: only `"channels_last"` (the default) is supported.
        name: model name (default `"vit"` or `"vit-{variant}"`).
        dtype: the dtype policy of the layers (default: the global policy); the head
            computes in float32 under every policy.
        quantized: `{layer path: mode}` of layers to quantize (`model.quantize`) once
            built; what `get_config` records for a quantized model.
        preprocessing: the pixel preprocessing the weights expect (mean, std, resize
            filter, crop fraction; `keras_vit.models.preprocessing`), which
            `classify`, export, few-shot and the engine apply; None (recorded nowhere)
            is `DEFAULT`, pixels scaled to [-1, 1].

    Example:

    >>> model = VisionTransformer(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                           num_heads=4, mlp_dim=64, num_classes=10)
    >>> tuple(model(keras.ops.zeros((1, 32, 32, 3))).shape)
    (1, 10)
    >>> config = model.get_config()
    >>> config["hidden_dim"], config["num_layers"], config["classifier"]
    (32, 2, 'token')
    >>> VisionTransformer.from_config(config).count_params() == model.count_params()
    True
    """

    def __init__(
        self,
        variant=None,
        *,
        image_size=224,
        dynamic_image_size=False,
        dynamic_image_pad=False,
        pos_interpolation="bicubic_antialias",
        num_classes=1000,
        patch_size=None,
        hidden_dim=None,
        num_layers=None,
        num_heads=None,
        mlp_dim=None,
        resnet_stages=None,
        classifier="token",
        representation_size=None,
        pos_embedding="learned",
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        gelu_approximate=False,
        include_top=True,
        pooling=True,
        channels=3,
        head_bias_init=0.0,
        distilled=False,
        distillation_head=True,
        no_embed_class=False,
        layer_scale_init=None,
        layer_norm_epsilon=1e-6,
        num_registers=0,
        mlp="gelu",
        data_format=None,
        name=None,
        dtype=None,
        quantized=None,
        preprocessing=None,
        pre_norm=False,
        quick_gelu=False,
        patch_bias=True,
        projection_dim=None,
        rope=False,
        rope_reference_grid=None,
        mlp_norm=False,
        fc_norm=False,
        naflex=False,
        images_per_row=None,
        remat=False,
        **kwargs,
    ):
        unknown = sorted(set(kwargs) - {"trainable"})  # Keras' Model ignores the others
        if unknown:
            names = [field.name for field in dataclasses.fields(Architecture)]
            close = difflib.get_close_matches(unknown[0], names, n=1)
            raise TypeError(
                f"VisionTransformer got an unknown argument {unknown[0]!r}"
                + (f": did you mean {close[0]!r}?" if close else
                   ": see help(keras_vit.VisionTransformer) for its arguments.")
            )
        given = locals()  # the architecture arguments, read by the fields' names
        arch = Architecture(**{
            field.name: given[field.name] for field in dataclasses.fields(Architecture)
        })
        if name is None:
            name = "vit" if variant is None else f"vit-{variant.replace('/', '_')}"
        policy = keras.dtype_policies.get(dtype)
        # Before any layer is made: a model too large would grow until the system stops it.
        parameters = arch.parameter_count()
        size.check_fits(
            parameters * (2 if "16" in policy.variable_dtype else 4),
            f"This ViT ({parameters:,} parameters)",
            "make it smaller (num_layers, hidden_dim, mlp_dim, image_size).",
        )
        # The layers take the policy as they are made (nested layers too), as when a
        # model is built under a global policy.
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            images, outputs, parts = _build_graph(arch)
            super().__init__(images, outputs, name=name, **kwargs)
        finally:
            keras.config.set_dtype_policy(previous)
        self._architecture = arch
        self._parts = parts
        # A quantized model (`model.quantize(...)`) is rebuilt float, then quantized
        # again layer by layer, so that `load_model` finds the variables it saved.
        quantized = dict(quantized or {})
        for mode in sorted(set(quantized.values())):
            self.quantize(mode, filters=lambda layer, mode=mode: quantized.get(layer.path) == mode)

    @property
    def architecture(self):
        """The model's `Architecture`: the arguments it was built from, checked."""
        return self._architecture

    @property
    def parts(self):
        """The model's `ViTParts`: its layers by role."""
        return self._parts

    @property
    def preprocessing(self):
        """The preprocessing dict the model was built with (`check_preprocessing`'s
        form), `DEFAULT`'s without one."""
        return check_preprocessing(self._architecture.preprocessing or DEFAULT)

    def kernels(self):
        """The matrix kernels weight decay applies to (`ViTParts.kernels`)."""
        return self._parts.kernels()

    def get_config(self):
        return {
            "name": self.name,
            "trainable": self.trainable,
            "dtype": keras.dtype_policies.serialize(self.dtype_policy),
            **self._architecture.get_config(),
            **self._quantized_entry(),
        }

    def _quantized_entry(self):
        """`{"quantized": {layer path: mode}}` once layers were quantized, else `{}`."""
        quantized = {
            layer.path: layer.quantization_mode
            for layer in keras_compat.sublayers(self)
            if layer is not self and getattr(layer, "quantization_mode", None)
        }
        return {"quantized": quantized} if quantized else {}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        if "layers" in config:  # the layer graph keras-vit 0.1.0 saved
            config = _arguments_from_graph(config)
        return cls(**config)

    def call(self, inputs, training=None, mask=None):
        """`keras.Model`'s functional call; on PyTorch each layer of the graph runs
        through `keras_vit.backend.calls.call_sublayer`: its own `call` where that
        computes the same numbers, without the Python of `Layer.__call__` that an eager
        step spends on every layer, and that a GPU waits on. A layer Keras
        rematerialises in training keeps `Layer.__call__`.

        Example:

        >>> model = VisionTransformer(image_size=8, patch_size=4, hidden_dim=8, num_layers=1,
        ...                           num_heads=2, mlp_dim=16, num_classes=3)
        >>> tuple(model(keras.ops.zeros((2, 8, 8, 3))).shape)
        (2, 3)
        """
        if keras.backend.backend() != "torch" or mask is not None:
            return super().call(inputs, training=training, mask=mask)

        def call_node(layer, *args, **kwargs):
            if not isinstance(layer, keras.layers.Layer):
                return layer(*args, **kwargs)
            # What Keras' functional call passes on: `training` where the call takes it.
            if training is not None and keras_compat.call_takes_training(layer):
                kwargs["training"] = training
            if training and keras_compat.remat_mode(layer) is not None:
                return layer(*args, **kwargs)
            return call_sublayer(self, layer, *args, **kwargs)

        return keras_compat.run_graph(self, inputs, call_node)

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
            sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
            validation_batch_size=None, validation_freq=1):
        """`keras.Model.fit`; on TensorFlow without a `tf.distribute` strategy, NumPy
        arrays `x` and `y` (without `sample_weight`, `class_weight` or `steps_per_epoch`),
        and the arrays of `validation_split` or a `validation_data` pair, are read as
        `keras_vit.utils.tf_data.array_batches` batches them (see `evaluate`), in the
        order `shuffle` asks for. The batches are those of Keras' own path: the same ones
        in order, the same split, a new permutation on each epoch.

        Example:

        >>> import numpy as np
        >>> model = VisionTransformer(image_size=8, patch_size=4, hidden_dim=8, num_layers=1,
        ...                           num_heads=2, mlp_dim=16, num_classes=3)
        >>> model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        >>> history = model.fit(np.zeros((6, 8, 8, 3)), np.zeros(6), batch_size=4,
        ...                     validation_split=0.5, epochs=2, verbose=0)
        >>> sorted(history.history)
        ['loss', 'val_loss']
        """
        arguments = dict(
            x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=verbose,
            callbacks=callbacks, validation_split=validation_split,
            validation_data=validation_data, shuffle=shuffle, class_weight=class_weight,
            sample_weight=sample_weight, initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            validation_batch_size=validation_batch_size, validation_freq=validation_freq,
        )
        return super().fit(**_tensorflow_fit_arguments(self, arguments))

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """`keras.Model.predict`; on TensorFlow, arrays are read as
        `keras_vit.utils.tf_data.array_batches` batches them (see `evaluate`).

        Example:

        >>> import numpy as np
        >>> model = VisionTransformer(image_size=8, patch_size=4, hidden_dim=8, num_layers=1,
        ...                           num_heads=2, mlp_dim=16, num_classes=3)
        >>> model.predict(np.zeros((5, 8, 8, 3)), batch_size=2, verbose=0).shape
        (5, 3)
        """
        batches = _tensorflow_array_batches(self, (x,), batch_size)
        if batches is not None:
            x, batch_size = batches, None
        return super().predict(
            x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks
        )

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False, **kwargs):
        """`keras.Model.evaluate`; on TensorFlow, arrays `x` and `y` (without
        `sample_weight`) are read as `keras_vit.utils.tf_data.array_batches` batches them.

        Keras' TensorFlow trainer makes arrays into an autotuned `tf.data` pipeline for
        each call, which can wait after the last batch
        (`keras_vit.utils.tf_data.without_autotuning`), and first copies them whole into one
        tensor; without a `tf.distribute` strategy keras-vit slices them a batch at a
        time instead. The batches and results are the same.
        """
        batches = None if kwargs or sample_weight is not None else (
            _tensorflow_array_batches(self, (x, y), batch_size)
        )
        if batches is not None:
            x, y, batch_size = batches, None, None
        return super().evaluate(
            x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight,
            steps=steps, callbacks=callbacks, return_dict=return_dict, **kwargs,
        )

    def auto_jit_compile(self):
        backend = keras.backend.backend()
        if backend == "tensorflow" and not _under_strategy(self):
            return True
        if backend == "torch":
            return False  # eager: torch.compile's compile is asked for (class docstring)
        return None  # Keras decides


def _under_strategy(model):
    """Whether `model` (on TensorFlow) was built under a `tf.distribute` strategy or
    one is in scope now."""
    import tensorflow as tf

    return keras_compat.built_strategy(model) is not None or tf.distribute.has_strategy()


def _tensorflow_array_batches(model, arrays, batch_size):
    """On the TensorFlow backend, `arrays` (each an array or a tensor) in batches by
    `keras_vit.utils.tf_data.array_batches`, Keras' default batch of 32 if `batch_size` is None,
    sliced a batch at a time unless `model` runs under a `tf.distribute` strategy (which
    shards them by example); None on another backend or when one of them is not an
    array (Keras reads those)."""
    if keras.backend.backend() != "tensorflow":
        return None
    from keras_vit.utils.tf_data import array_batches, is_array

    if not all(map(is_array, arrays)):
        return None
    return array_batches(
        arrays if len(arrays) > 1 else arrays[0], batch_size or 32, _under_strategy(model)
    )


def _tensorflow_fit_arguments(model, arguments):
    """`VisionTransformer.fit`'s `arguments`, on TensorFlow without a `tf.distribute`
    strategy with its arrays made into datasets by
    `keras_vit.utils.tf_data.array_fit_arguments`; otherwise as they are."""
    if keras.backend.backend() != "tensorflow" or _under_strategy(model):
        return arguments
    from keras_vit.utils.tf_data import array_fit_arguments

    return array_fit_arguments(arguments)


def _rotary_embedding(rope, *, head_dim, grid_size, num_prefix_tokens, reference_grid):
    """The model's rotary embedding layer, named `rope`: EVA-02's `RotaryEmbedding` for
    `rope=True`, else the registered layer whose config `rope` is, made for this
    model's head width, patch grid and prefix tokens (in the model's dtype policy)."""
    if rope is True:
        return vit_layers.RotaryEmbedding(
            head_dim, grid_size=grid_size, reference_grid=reference_grid,
            num_prefix_tokens=num_prefix_tokens, name="rope",
        )
    config = {k: v for k, v in rope["config"].items() if k != "dtype"}
    config.update(head_dim=head_dim, grid_size=grid_size, num_prefix_tokens=num_prefix_tokens,
                  name="rope")
    # Its class and config only: a serialized built layer also records how it was built.
    spec = {k: rope[k] for k in ("module", "class_name", "registered_name") if k in rope}
    layer = keras.saving.deserialize_keras_object({**spec, "config": config})
    if not isinstance(layer, keras.layers.Layer):
        raise ValueError(f"rope must name a Keras layer, got {type(layer).__name__} from {rope!r}.")
    return layer


def _naflex_inputs(arch):
    """The inputs of a NaFlex model: `keras_vit.naflex_inputs`' dict, any token count; a
    packed model's `spatial_shapes` are `(images_per_row, 2)` per row."""
    slots = () if arch.images_per_row is None else (arch.images_per_row,)
    return {
        "patches": keras.Input((None, arch.patch_size**2 * arch.channels), name="patches"),
        "patch_mask": keras.Input((None,), name="patch_mask"),
        "spatial_shapes": keras.Input((*slots, 2), dtype="int32", name="spatial_shapes"),
    }


def _build_graph(arch):
    """The model's input, output and `ViTParts`, from its `Architecture`.

    The layer names are the ones `.keras` files address the weights by, and
    `keras_vit.training.jax_distribution` shards them by: `BLOCK_NAME` for the blocks.
    """
    grid = arch.grid_size  # the patches of the trained size
    stem = token_grid = patch_mask = None
    packed = arch.images_per_row  # the slots of a packed NaFlex row, or None
    if packed:
        images = _naflex_inputs(arch)
        patches = vit_layers.PackedNaFlexPatches(
            arch.patch_size, packed, arch.channels, name="naflex_patches"
        )
        patch_mask = images["patch_mask"]
        patch_grid, token_grid = patches(images["patches"], images["spatial_shapes"], patch_mask)
    elif arch.naflex:
        images = _naflex_inputs(arch)
        patches = vit_layers.NaFlexPatches(arch.patch_size, arch.channels, name="naflex_patches")
        patch_grid, token_grid = patches(images["patches"], images["spatial_shapes"])
        patch_mask = images["patch_mask"]
    else:
        shape = (None, None) if arch.dynamic_image_size else arch.image_size
        images = keras.Input((*shape, arch.channels), name="images")
        x = images
        if arch.dynamic_image_pad:
            x = vit_layers.PadToMultiple(arch.stride, name="pad")(x)
        if arch.resnet_stages is not None:
            x, stem = resnet.resnet_trunk(x, arch.resnet_stages)
        # A dynamic model's patches keep their grid, to which the position table is resampled.
        patches = vit_layers.Patches(
            arch.patch_size, flatten=not arch.dynamic_image_size, name="patches"
        )
        patch_grid = patches(x)
    patch_encoder = vit_layers.PatchEncoder(
        arch.hidden_dim,
        grid_size=grid,
        pos_embedding=arch.pos_embedding,
        interpolation=arch.pos_interpolation,
        use_bias=arch.patch_bias,
        name="patch_encoder",
    )
    x = patch_encoder(patch_grid) if token_grid is None else patch_encoder(patch_grid, token_grid)
    class_token = distillation_token = registers = None
    # Prefix tokens learn their own position rows unless no_embed_class.
    use_position = arch.pos_embedding.startswith("learned") and not arch.no_embed_class
    num_prefix = (arch.classifier in CLASS_TOKEN_CLASSIFIERS) + arch.distilled + arch.num_registers
    # A packed row's prefix tokens are prepended to each slot's empty prefix, then put in
    # front of the patches slot after slot.
    prefixed = vit_layers.SlotPrefix(packed, name="slot_prefix")(x) if packed and num_prefix else x
    if arch.num_registers:  # prepended first, so that they follow the other prefix tokens
        # Without position rows, as DINOv2's: added after the position embedding.
        registers = vit_layers.ClassToken(num_tokens=arch.num_registers, name="registers")
        prefixed = registers(prefixed)
    if arch.distilled:  # prepended first, so that it follows the class token
        distillation_token = vit_layers.ClassToken(
            use_position=use_position, name="distillation_token"
        )
        prefixed = distillation_token(prefixed)
    if arch.classifier in CLASS_TOKEN_CLASSIFIERS:
        class_token = vit_layers.ClassToken(use_position=use_position, name="class_token")
        prefixed = class_token(prefixed)
    x = vit_layers.PackSlots(name="pack_slots")(prefixed, x) if packed and num_prefix else prefixed
    dropout = keras.layers.Dropout(arch.dropout_rate, name="embedding_dropout")
    x = dropout(x)
    pre = None
    if arch.pre_norm:  # after the position embedding and its dropout, as timm's norm_pre
        pre = vit_layers.LayerNormalization(epsilon=arch.layer_norm_epsilon, name="pre_norm")
        x = pre(x)
    token_mask = None
    if patch_mask is not None:  # the tokens in front of the patches are never padding
        token_mask = vit_layers.TokenMask(
            num_prefix, images_per_row=packed, name="token_mask"
        )(patch_mask)
    masked = pooled_mask = {} if token_mask is None else {"token_mask": token_mask}
    if packed:  # each token attends to its own slot's tokens; each slot is pooled alone
        pairs, rows = vit_layers.SlotMasks(packed, name="slot_masks")(token_mask)
        masked, pooled_mask = {"token_mask": pairs}, {"token_mask": rows}
    rotary = table = None
    if arch.rope:  # one table of the patch grid's rotations, which every block applies
        rotary = _rotary_embedding(
            arch.rope,
            head_dim=arch.hidden_dim // arch.num_heads,
            grid_size=grid,
            num_prefix_tokens=num_prefix * (packed or 1),
            reference_grid=arch.rope_reference_grid,
        )
        table = rotary(patch_grid) if token_grid is None else rotary(patch_grid, token_grid)
    blocks = []
    names = [BLOCK_NAME.format(index=i) for i in range(arch.num_layers)]
    # Keras rematerialises a layer made under a RematScope that names it (its sublayers,
    # named otherwise, are recomputed as part of it, not on their own).
    scope = (
        keras.RematScope("list_of_layers", layer_names=names) if arch.remat
        else contextlib.nullcontext()
    )
    for i in range(arch.num_layers):
        with scope:
            block = vit_layers.TransformerBlock(
                arch.num_heads,
                arch.mlp_dim,
                dropout_rate=arch.dropout_rate,
                attention_dropout_rate=arch.attention_dropout_rate,
                drop_path_rate=arch.drop_path_rate * i / max(arch.num_layers - 1, 1),
                gelu_approximate=arch.gelu_approximate,
                layer_scale_init=arch.layer_scale_init,
                layer_norm_epsilon=arch.layer_norm_epsilon,
                mlp=arch.mlp,
                quick_gelu=arch.quick_gelu,
                rope=bool(arch.rope),
                mlp_norm=arch.mlp_norm,
                name=names[i],
            )
        blocks.append(block)
        x = block(x, **masked) if table is None else block(x, rope=table, **masked)
    norm = vit_layers.LayerNormalization(
        epsilon=arch.layer_norm_epsilon, name="fc_norm" if arch.fc_norm else "encoder_norm"
    )
    # With fc_norm the norm follows the pooling; tokens alone are still normalised.
    pooled_norm = arch.fc_norm and (arch.include_top or arch.pooling)
    tokens = x = x if pooled_norm else norm(x)
    two_heads = arch.distilled and arch.distillation_head

    def new_head(name):
        return keras.layers.Dense(
            arch.num_classes,
            kernel_initializer="zeros",
            bias_initializer=keras.initializers.Constant(arch.head_bias_init),
            dtype="float32",
            name=name,
        )

    pool = pre_logits = head = head_dist = projection = None
    if arch.include_top or arch.pooling:
        if arch.classifier == "map":
            pool = vit_layers.MAPHead(
                arch.num_heads, arch.mlp_dim, layer_norm_epsilon=arch.layer_norm_epsilon,
                gelu_approximate=arch.gelu_approximate, quick_gelu=arch.quick_gelu, name="pool",
            )
        else:
            pool = vit_layers.TokenPooling(
                "distilled" if two_heads
                else "gap" if arch.classifier == "avg" else arch.classifier,
                # token_gap and avg average the patches: after the class token and the registers.
                index=1 + arch.num_registers + arch.distilled
                if arch.classifier in ("token_gap", "avg") else 0,
                name="pool",
            )
        x = pool(tokens, **pooled_mask)
        if pooled_norm:
            x = norm(x)
        if arch.representation_size:
            pre_logits = keras.layers.Dense(
                arch.representation_size, activation="tanh", name="pre_logits"
            )
            x = pre_logits(x)
        if arch.projection_dim:
            projection = vit_layers.Dense(arch.projection_dim, use_bias=False, name="projection")
            x = projection(x)
    if arch.include_top and two_heads:
        # Each head reads its own token; the logits are their mean (timm, HF).
        head, head_dist = new_head("head"), new_head("head_dist")
        x = keras.layers.Average(dtype="float32", name="mean_of_heads")([
            head(vit_layers.TokenPooling("token", name="class_pool")(tokens)),
            head_dist(vit_layers.TokenPooling("token", index=1, name="distillation_pool")(tokens)),
        ])
    elif arch.include_top:
        head = new_head("head")
        x = head(x)
    parts = ViTParts(
        stem, patches, patch_encoder, class_token, dropout, tuple(blocks), norm, pool,
        pre_logits, head, distillation_token, head_dist, registers, pre, projection, rotary,
    )
    return images, x, parts


def _arguments_from_graph(config):
    """`VisionTransformer` arguments equal to a keras-vit 0.1.0 layer-graph config.

    Those files keep only the layer graph `ViT` built; every argument is read back
    from its layers' configs (the variant from the model's default name, `vit-B_16`).
    """
    layers = {}
    blocks, units = [], []
    for entry in config["layers"]:
        kind, layer = entry["class_name"], entry["config"]
        if kind == "TransformerBlock":
            blocks.append(layer)
        elif kind == "BottleneckUnit":
            units.append(layer["name"])
        else:
            layers[layer["name"]] = (kind, layer)
    batch_shape = layers["images"][1]["batch_shape"]
    patches = layers["patches"][1]
    encoder = layers["patch_encoder"][1]
    head = layers.get("head", (None, None))[1]
    pre_logits = layers.get("pre_logits", (None, None))[1]
    pool = layers.get("pool", (None, None))[1]
    stages = None
    if "conv_root" in layers:
        counts = {}
        for unit in units:  # block{stage}_unit{unit}
            stage = int(unit.split("_")[0][len("block"):])
            counts[stage] = counts.get(stage, 0) + 1
        stages = tuple(counts[s] for s in sorted(counts))
    if pool is not None:
        classifier = pool["classifier"]
    else:
        classifier = "token" if "class_token" in layers else "gap"
    first = blocks[0] if blocks else {}
    arguments = dict(
        image_size=tuple(batch_shape[1:3]),
        channels=batch_shape[3],
        patch_size=patches["patch_size"],
        hidden_dim=encoder["hidden_dim"],
        num_layers=len(blocks),
        num_heads=first.get("num_heads", 1),
        mlp_dim=first.get("mlp_dim", 1),
        resnet_stages=stages,
        classifier=classifier,
        representation_size=pre_logits["units"] if pre_logits else None,
        pos_embedding=encoder["pos_embedding"],
        dropout_rate=layers["embedding_dropout"][1]["rate"],
        attention_dropout_rate=first.get("attention_dropout_rate", 0.0),
        # The last block's rate is the model's (the first's is 0).
        drop_path_rate=blocks[-1]["drop_path_rate"] if blocks else 0.0,
        gelu_approximate=first.get("gelu_approximate", False),
        include_top=head is not None,
        pooling=pool is not None,
        name=config["name"],
        trainable=config.get("trainable", True),
        dtype=encoder.get("dtype"),
    )
    if head is not None:
        arguments["num_classes"] = head["units"]
        arguments["head_bias_init"] = head["bias_initializer"]["config"]["value"]
    # The name ViT gives a variant's model; the sizes read above override the variant's.
    named = config["name"][len("vit-"):].replace("_", "/")
    if config["name"].startswith("vit-") and named in VARIANTS:
        arguments["variant"] = named
    return arguments


def preprocess(images, preprocessing=None):
    """Scales uint8 or [0, 255] images to a model's input: by default to [-1, 1], else
    with the mean and std of `preprocessing` (a model's: `model_preprocessing(model)`).

    Example:

    >>> float(preprocess(keras.ops.full((1, 2, 2, 3), 255))[0, 0, 0, 0])
    1.0
    """
    return normalize(ops.cast(images, "float32"), preprocessing)
