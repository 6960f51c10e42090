"""Pretrained weights: `pretrained(name)`, `load_pretrained` into a `keras_vit.ViT`
model, and `save_npz`.

Every checkpoint is read in the official vit_jax layout (`keras_vit.weights.formats`),
which is also what `save_npz` writes; this module maps that one layout onto the
model's weights and adapts the position embedding, the head and `pre_logits`.
"""

import dataclasses
import io
import logging
import math
import os

import keras
import numpy as np

from keras_vit.families.family import (
    ATTENTION_KEY,
    BLOCK_KEY,
    MAP_ATTENTION_KEY,
    MAP_HEAD_KEY,
    MLP_NORM_KEY,
    POS_KEY,
    PRE_NORM_KEY,
    PROJECTION_KEY,
    QKV,
)
from keras_vit.layers import posembed
from keras_vit.models import flexi
from keras_vit.models.architecture import ARCHITECTURE, FAMILY_DEFAULTS
from keras_vit.models.vit import VisionTransformer
from keras_vit.weights.download import refuse_cached
from keras_vit.weights.formats import read_official
from keras_vit.layers.embedding import sincos_2d_table
from keras_vit.layers.pooling import MAPHead
from keras_vit.models.vit import vit_parts
from keras_vit.utils.files import atomic_write
from keras_vit.utils.model_files import read_keras, weight_problems
from keras_vit.weights.sources import resolve_source

logger = logging.getLogger(__name__)

# vit_jax resamples with scipy's zoom; timm (and so the HF/timm weights) bicubically.
_DEFAULT_INTERPOLATION = {
    "vit_jax": "bilinear_align_corners",
    "big_vision": "bilinear_align_corners",
    "hf": "bicubic_antialias",
    "timm": "bicubic_antialias",
}


# The classification heads by official key (and `ViTParts` attribute): DeiT's
# distillation head beside the head.
HEADS = ("head", "head_dist")


class NotFiniteWeights(ValueError):
    """A strict load refused a checkpoint holding NaN or infinite values; `problem` is
    the line naming them (`keras_vit.utils.model_files.weight_problems`), for callers that say what to do."""

    def __init__(self, problem):
        super().__init__(f"{problem}; pass strict=False to load it anyway.")
        self.problem = problem


@dataclasses.dataclass
class LoadReport:
    """What `load_pretrained` did. Keys are in the official vit_jax `.npz` layout.

    Attributes:
        source: the checkpoint path or URL.
        format: `"vit_jax"`, `"big_vision"`, `"hf"` or `"timm"`.
        loaded: keys copied into the model.
        missing: keys the model has and the checkpoint lacks (left unchanged); model
            weights outside the official layout appear under their Keras path.
        unexpected: checkpoint keys the model has no place for (ignored).
        mismatched: `(key, checkpoint_shape, model_shape)` of tensors that do not fit.
        messages: what was adapted (head reset, pre_logits dropped, resampling).
    """

    source: str
    format: str
    loaded: list = dataclasses.field(default_factory=list)
    missing: list = dataclasses.field(default_factory=list)
    unexpected: list = dataclasses.field(default_factory=list)
    mismatched: list = dataclasses.field(default_factory=list)
    messages: list = dataclasses.field(default_factory=list)
    _levels: list = dataclasses.field(default_factory=list, repr=False)

    def _note(self, text, level=logging.INFO):
        self.messages.append(text)
        self._levels.append(level)

    def _log(self):
        # Only once the weights are in: a strict failure changes nothing, says nothing.
        for text, level in zip(self.messages, self._levels):
            logger.log(level, "%s: %s", self.source, text)


# ---------------------------------------------------------------------------
# The official layout <-> the model's weights.


@dataclasses.dataclass
class _Slot:
    """A model variable, the official keys it holds, and the maps between them."""

    keys: tuple
    variable: object
    split: object = lambda array: [array]
    join: object = lambda parts: parts[0]


class _ModelLayout:
    """A `keras_vit.ViT` model's weights seen in the official layout."""

    def __init__(self, model):
        self.parts = vit_parts(model)
        self.blocks = self.parts.blocks
        self.encoder = self.parts.patch_encoder
        self.class_token = self.parts.class_token
        # The tokens in front of the patches, in order, with their official keys.
        self.prefix = tuple(
            (key, token)
            for key, token in (("cls", self.class_token), ("dist", self.parts.distillation_token))
            if token is not None
        )
        self.heads = self.blocks[0].num_heads if self.blocks else 1
        self.slots = self._slots()
        # Weights outside the official ViT layout, should a model have any.
        mapped = {id(slot.variable) for slot in self.slots}
        mapped.update(id(v) for v in self._position_variables())
        self.unmapped = [v for v in model.weights if id(v) not in mapped]

    def _position_variables(self):
        for _, token in self.prefix:
            if token.use_position:
                yield token.position
        if self.encoder.pos_embedding == "learned":
            yield self.encoder.position
        elif self.encoder.pos_embedding == "learned2d":
            yield from (self.encoder.row_position, self.encoder.col_position)

    def _slots(self):
        slots = []
        projection = self.encoder.projection
        patch = self.parts.patches.patch_size
        width = self.encoder.hidden_dim
        slots.append(
            _Slot(
                ("embedding/kernel",),
                projection.kernel,
                lambda a: [a.reshape(patch, patch, -1, width)],
                lambda parts: parts[0].reshape(-1, width),
            )
        )
        if projection.bias is not None:  # CLIP's patch embedding has none (patch_bias=False)
            slots.append(_Slot(("embedding/bias",), projection.bias))
        for key, token in self.prefix:
            slots.append(_Slot((key,), token.token))
        if self.parts.registers is not None:  # no position rows: not in `prefix`
            slots.append(_Slot(("reg",), self.parts.registers.token))

        def norm(key, layer):
            slots.append(_Slot((f"{key}/scale",), layer.gamma))
            slots.append(_Slot((f"{key}/bias",), layer.beta))

        def dense(key, layer):
            slots.append(_Slot((f"{key}/kernel",), layer.kernel))
            slots.append(_Slot((f"{key}/bias",), layer.bias))

        # A hybrid's ResNet trunk: official keys `conv_root`, `gn_root` and
        # `block{s}/unit{u}/{conv,gn}{1,2,3,_proj}`.
        stem = self.parts.stem
        if stem is not None:
            slots.append(_Slot(("conv_root/kernel",), stem.root_conv.kernel))
            norm("gn_root", stem.root_norm)
            for s, stage in enumerate(stem.stages):
                for u, unit in enumerate(stage):
                    prefix = f"block{s + 1}/unit{u + 1}"
                    for suffix, (conv, gn) in unit.convolutions().items():
                        slots.append(_Slot((f"{prefix}/conv{suffix}/kernel",), conv.kernel))
                        norm(f"{prefix}/gn{suffix}", gn)

        if self.parts.pre_norm is not None:
            norm(PRE_NORM_KEY, self.parts.pre_norm)
        for i, block in enumerate(self.blocks):
            prefix, mha, heads = BLOCK_KEY.format(i=i), ATTENTION_KEY.format(i=i), block.num_heads
            norm(prefix + "LayerNorm_0", block.norm1)
            # The fused q|k|v projection holds the three (D, heads, head_dim) kernels.
            slots.extend(_attention_slots(mha, heads, [(QKV, block.qkv)], block.attention_output))
            norm(prefix + "LayerNorm_2", block.norm2)
            dense(prefix + "MlpBlock_3/Dense_0", block.mlp_fc1)
            if block.mlp_norm is not None:
                norm(prefix + MLP_NORM_KEY, block.mlp_norm)
            dense(prefix + "MlpBlock_3/Dense_1", block.mlp_fc2)
            for branch, scale in zip(("attention", "mlp"), block.layer_scales):
                slots.append(_Slot((f"{prefix}LayerScale_{branch}/scale",), scale))
        norm("Transformer/encoder_norm", self.parts.norm)
        if isinstance(self.parts.pool, MAPHead):
            slots.extend(_map_head_slots(self.parts.pool))
        if self.parts.projection is not None:  # bias-free
            slots.append(_Slot((f"{PROJECTION_KEY}/kernel",), self.parts.projection.kernel))
        for key in ("pre_logits", *HEADS):
            if getattr(self.parts, key) is not None:
                dense(key, getattr(self.parts, key))
        return slots

    def params(self):
        """The model's weights in the official layout, without the position table."""
        params = {}
        for slot in self.slots:
            params.update(zip(slot.keys, slot.split(keras.ops.convert_to_numpy(slot.variable))))
        return params

    def position_table(self):
        """The official `(1, [prefix +] patches, D)` table, a row for each token in
        front of the patches first (zero for one without a position): the model's
        function in VT's terms."""
        table = self.encoder.position_table()
        rows, cols = self.encoder.grid_size
        width = self.encoder.hidden_dim
        if table is None:
            table = np.zeros((1, rows * cols, width), "float32")
        table = keras.ops.convert_to_numpy(table)
        prefix_rows = [
            keras.ops.convert_to_numpy(token.position) if token.use_position
            else np.zeros((1, 1, width), table.dtype)
            for _, token in self.prefix
        ]
        return np.concatenate([*prefix_rows, table], axis=1)

    def assign(self, params, keys):
        """Writes `params` (a complete official dict) to the variables holding `keys`."""
        for slot in self.slots:
            if keys.intersection(slot.keys):
                value = slot.join([params[key] for key in slot.keys])
                slot.variable.assign(np.asarray(value, dtype=slot.variable.dtype))


def _attention_slots(mha, heads, projections, output):
    """The `_Slot`s of an attention under big_vision's keys (`{mha}/query|key|value|out`):
    each of `projections` (`(names, Dense)`, a Dense holding the named projections side
    by side) as `(D, heads, head_dim)` kernels and `(heads, head_dim)` biases, and the
    `output` Dense as a `(heads, head_dim, D)` kernel."""
    def split_kernel(parts):
        return lambda a: [k.reshape(k.shape[0], heads, -1) for k in np.split(a, parts, 1)]

    def split_bias(parts):
        return lambda a: [b.reshape(heads, -1) for b in np.split(a, parts)]

    def join_kernel(parts):
        return np.concatenate([k.reshape(k.shape[0], -1) for k in parts], 1)

    def join_bias(parts):
        return np.concatenate([b.reshape(-1) for b in parts])

    slots = []
    for names, layer in projections:
        slots.append(_Slot(tuple(f"{mha}/{n}/kernel" for n in names), layer.kernel,
                           split_kernel(len(names)), join_kernel))
        slots.append(_Slot(tuple(f"{mha}/{n}/bias" for n in names), layer.bias,
                           split_bias(len(names)), join_bias))
    slots.append(_Slot((f"{mha}/out/kernel",), output.kernel,
                       lambda a: [a.reshape(heads, -1, a.shape[1])],
                       lambda parts: parts[0].reshape(-1, parts[0].shape[-1])))
    slots.append(_Slot((f"{mha}/out/bias",), output.bias))
    return slots


def _map_head_slots(head):
    """The `_Slot`s of a `MAPHead` under big_vision's keys (`MAPHead_0/...`): the
    probe, the attention (`_attention_slots`; the key and value held by one fused
    Dense), the LayerNorm and the MLP."""
    slots = [_Slot((f"{MAP_HEAD_KEY}/probe",), head.probe)]
    slots.extend(_attention_slots(
        MAP_ATTENTION_KEY, head.num_heads,
        [(QKV[:1], head.query), (QKV[1:], head.key_value)], head.attention_output,
    ))
    slots.append(_Slot((f"{MAP_HEAD_KEY}/LayerNorm_0/scale",), head.norm.gamma))
    slots.append(_Slot((f"{MAP_HEAD_KEY}/LayerNorm_0/bias",), head.norm.beta))
    for i, layer in enumerate((head.mlp_fc1, head.mlp_fc2)):
        for param in ("kernel", "bias"):
            key = f"{MAP_HEAD_KEY}/MlpBlock_0/Dense_{i}/{param}"
            slots.append(_Slot((key,), getattr(layer, param)))
    return slots


def _checkpoint_grid(count, model_grid, report, given=None):
    """The patch grid of a position table of `count` patch rows."""
    if given is not None:
        if count != given[0] * given[1]:
            raise ValueError(
                f"checkpoint_grid={tuple(given)} has {given[0] * given[1]} patches, but "
                f"{report.source} has {count} patch position embeddings: pass the grid it "
                "was trained at."
            )
        return tuple(given)
    # Same patch count: the model's grid, as vit_jax and timm assume. Otherwise the
    # released checkpoints are all square.
    if count == model_grid[0] * model_grid[1]:
        if model_grid[0] != model_grid[1]:
            report._note(
                f"position embedding read as the model's {model_grid[0]}x{model_grid[1]} "
                "patch grid (pass checkpoint_grid=(rows, cols) if it was trained at another)."
            )
        return tuple(model_grid)
    side = math.isqrt(count)
    if side * side == count:
        return (side, side)
    raise ValueError(
        f"Cannot tell the patch grid of the {count} position embeddings in {report.source}: "
        f"{count} is not square and differs from the model's {model_grid[0]}x"
        f"{model_grid[1]} grid; pass the grid it was trained at: load_pretrained(..., "
        "checkpoint_grid=(rows, cols))."
    )


def _position_assignments(layout, table, interpolation, report, checkpoint_grid=None):
    """`[(variable, value)]` that put the official table into the model, or raises."""
    encoder = layout.encoder
    rows, cols = encoder.grid_size
    width = encoder.hidden_dim
    prefix = len(layout.prefix)
    expected = (1, rows * cols + prefix, width)
    if table.ndim != 3 or table.shape[::2] != (1, width) or table.shape[1] <= prefix:
        report.mismatched.append((POS_KEY, tuple(table.shape), expected))
        return []
    prefix_rows = [table[:, i : i + 1] for i in range(prefix)]
    patches = table[0, prefix:]
    old = _checkpoint_grid(len(patches), (rows, cols), report, checkpoint_grid)
    grid = patches.reshape(*old, width)
    if encoder.pos_embedding in ("sincos2d", "none"):
        if encoder.pos_embedding == "none":
            fixed = np.zeros_like(grid)
        else:
            fixed = keras.ops.convert_to_numpy(sincos_2d_table(old, width)).reshape(grid.shape)
        if any(np.any(row) for row in prefix_rows) or not np.allclose(grid, fixed, atol=1e-5):
            raise ValueError(
                f"Checkpoint {report.source} has a learned position embedding "
                f"({POS_KEY} {tuple(table.shape)}), but the model uses the fixed "
                f"pos_embedding={encoder.pos_embedding!r}: build the model with "
                "pos_embedding='learned'."
            )
        report.loaded.append(POS_KEY)
        return []
    assignments = []
    for (key, token), row in zip(layout.prefix, prefix_rows):
        if token.use_position:
            assignments.append((token.position, row))
        elif np.any(row):
            raise ValueError(
                f"Checkpoint {report.source} has a position embedding for the token "
                f"{key!r} ({POS_KEY} {tuple(table.shape)}), but the model adds none to it "
                "(no_embed_class=True): build the model with no_embed_class=False."
            )
    if old != (rows, cols):
        report._note(
            f"position embedding resampled from a {old[0]}x{old[1]} to a {rows}x{cols} "
            f"patch grid ({interpolation})."
        )
    if encoder.pos_embedding == "learned":
        grid = posembed.resample_position_grid(grid, (rows, cols), interpolation)
        assignments.append((encoder.position, grid.reshape(1, rows * cols, width)))
    else:  # learned2d: a row table and a column table, concatenated per patch
        half = width // 2
        row_table, col_table = grid[:, :1, :half], grid[:1, :, half:]
        rebuilt = np.concatenate(
            [np.broadcast_to(row_table, (*old, half)), np.broadcast_to(col_table, (*old, half))],
            axis=-1,
        )
        if not np.array_equal(grid, rebuilt):
            raise ValueError(
                f"Checkpoint {report.source} has a full learned position table "
                f"({POS_KEY} {tuple(table.shape)}), which a pos_embedding='learned2d' model "
                "(row and column tables) cannot hold: build the model with "
                "pos_embedding='learned'."
            )
        resample = posembed.resample_position_grid
        assignments.append((encoder.row_position, resample(row_table, (rows, 1), interpolation)))
        assignments.append((encoder.col_position, resample(col_table, (1, cols), interpolation)))
    report.loaded.append(POS_KEY)
    return assignments


def _resample_patches(params, current, report):
    got, want = params.get("embedding/kernel"), current["embedding/kernel"]
    # A Linear on flattened patches (HF's Siglip2, NaFlex) holds the official kernel's
    # values in its (row, column, channel) order: the model's patches are its own.
    if got is not None and got.ndim == 2 and got.shape == (np.prod(want.shape[:3]), want.shape[3]):
        params["embedding/kernel"] = got = got.reshape(want.shape)
    # FlexiViT: a checkpoint trained at another patch size serves this one.
    if got is None or got.ndim != 4 or got.shape[2:] != want.shape[2:]:
        return
    if got.shape[:2] != want.shape[:2]:
        params["embedding/kernel"] = flexi.resample_patch_embedding(got, want.shape[:2])
        report._note(
            f"patch embedding resampled from {got.shape[0]}x{got.shape[1]} to "
            f"{want.shape[0]}x{want.shape[1]} patches (FlexiViT pseudo-inverse)."
        )


def _drop_pre_logits(layout, params, report):
    # As vit_jax does when fine-tuning an in21k checkpoint without a representation layer.
    if layout.parts.pre_logits is not None or "pre_logits/kernel" not in params:
        return
    shape = tuple(params["pre_logits/kernel"].shape)
    for key in [key for key in params if key.startswith("pre_logits/")]:
        del params[key]
    report._note(
        f"the model has no pre_logits layer (representation_size=None): the checkpoint's "
        f"pre_logits {shape} is dropped.",
        logging.WARNING,
    )


def _reconcile_head(layout, params, current, report):
    """Returns the head values to force (zeros) when the checkpoint's heads cannot be
    used: each of the model's heads (`HEADS`) is reset when the checkpoint's has
    another class count, or when the checkpoint has none."""
    forced = {}
    for name in HEADS:
        keys = (f"{name}/kernel", f"{name}/bias")
        head = {key: params.pop(key) for key in keys if key in params}
        if layout.parts.head is None:
            if head:
                report._note(
                    f"the model has no head (include_top=False): the checkpoint's {name} "
                    "is not loaded."
                )
            continue
        if getattr(layout.parts, name) is None:  # reported as unexpected (strict: refused)
            params.update(head)
            continue
        kernel = current[keys[0]]
        got = head.get(keys[0])
        if got is None:
            reason = f"the checkpoint has no {name}"
        elif got.ndim == 2 and got.shape[0] == kernel.shape[0] and got.shape[1] != kernel.shape[1]:
            reason = f"the checkpoint's {name} has {got.shape[1]} classes, the model {kernel.shape[1]}"
        else:  # loaded, or reported as mismatched, like any other tensor
            params.update(head)
            continue
        report._note(f"{reason}: the {name} is reset to zeros.", logging.WARNING)
        forced.update({key: np.zeros_like(current[key]) for key in keys})
    return forced


def _classifiers(layout, params):
    """The `classifier` of the checkpoint `params` and of the model: `"token"` with a
    class token, else `"map"` with a MAP head, else `"gap"` (a model without pooling
    takes either)."""
    if "cls" in params:
        have = "token"
    else:
        have = "map" if any(key.startswith(MAP_HEAD_KEY + "/") for key in params) else "gap"
    pool = layout.parts.pool
    if layout.class_token is not None:
        need = "token"
    elif isinstance(pool, MAPHead):
        need = "map"
    else:
        need = have if pool is None and have != "token" else "gap"
    return have, need


def _drop_tower_parts(layout, params, report):
    """Leaves out a CLIP projection, or a MAP head, that the model has no place for
    (fine-tuning from the pooled features; `include_top=False, pooling=False`), with
    a note, as `_drop_pre_logits` does for `pre_logits`."""
    parts = layout.parts
    unused = []
    if parts.projection is None and f"{PROJECTION_KEY}/kernel" in params:
        unused.append((PROJECTION_KEY, "projection (projection_dim=None)"))
    if parts.pool is None and any(key.startswith(MAP_HEAD_KEY + "/") for key in params):
        unused.append((MAP_HEAD_KEY, "MAP head (pooling=False)"))
    for key, what in unused:
        for name in [name for name in params if name.startswith(key + "/")]:
            del params[name]
        report._note(f"the model has no {what}: the checkpoint's {key} is not loaded.")


def _check_switches(layout, params, source):
    """Raises a `ValueError` naming the `keras_vit.ViT` switch to change when the
    checkpoint has a part of the ViT family (DeiT's distillation token and head, DeiT
    III's and DINOv2's layer scale, registers, SwiGLU) that the model lacks, or lacks
    one the model has."""
    parts = layout.parts
    reg = params.get("reg")
    registers = reg.shape[1] if reg is not None and reg.ndim == 3 else None
    # (checkpoint has it, model has it, what it is, the argument that gives it, that removes it)
    checks = [
        (
            "dist" in params, parts.distillation_token is not None,
            "a distillation token 'dist' (DeiT)", "distilled=True", "distilled=False",
        ),
        (
            any("/LayerScale_" in key for key in params),
            any(block.layer_scales for block in layout.blocks),
            "layer scale (DeiT III)", "layer_scale_init=1e-6", "layer_scale_init=None",
        ),
        (
            registers is not None, parts.registers is not None,
            f"{registers or ''} register tokens 'reg'".lstrip(),
            f"num_registers={registers}", "num_registers=0",
        ),
        (
            _swiglu_checkpoint(params), any(block.mlp == "swiglu" for block in layout.blocks),
            "a SwiGLU MLP (DINOv2 giant)", "mlp='swiglu'", "mlp='gelu'",
        ),
        (
            f"{BLOCK_KEY.format(i=0)}{MLP_NORM_KEY}/scale" in params,
            any(block.mlp_norm is not None for block in layout.blocks),
            "a LayerNorm inside the MLP (EVA-02's)", "mlp_norm=True", "mlp_norm=False",
        ),
        (
            f"{PRE_NORM_KEY}/scale" in params, parts.pre_norm is not None,
            "pre_norm LayerNorm (CLIP's, before the blocks)", "pre_norm=True", "pre_norm=False",
        ),
        (
            "embedding/bias" in params or "embedding/kernel" not in params,
            parts.patch_embedding.bias is not None,
            "patch-embedding bias", "patch_bias=True", "patch_bias=False",
        ),
    ]
    if parts.head is not None and "head/kernel" in params and "dist" in params:
        checks.append((
            "head_dist/kernel" in params, parts.head_dist is not None,
            "a distillation head 'head_dist'", "distillation_head=True",
            "distillation_head=False",
        ))
    for has, model_has, what, adds, removes in checks:
        if has != model_has:
            raise ValueError(
                f"Checkpoint {source} {'has' if has else 'has no'} {what}, but the model "
                f"{'has none' if has else 'has it'}: build the model with "
                f"{adds if has else removes}."
            )


def _check_rope(layout, trained_with, source, report, strict):
    """Rope has no tensors, so a checkpoint trained with it (`trained_with`, from its
    keys: EVA-02's) fits a model without it and would answer wrong numbers: refused
    naming the switches, or with `strict=False` a warning. A model with rope whose
    reference grid is not the checkpoint's is noted: a file does not record the grid."""
    wanted = trained_with.get("rope")
    if not wanted:
        return
    rope = layout.parts.rope
    if isinstance(wanted, dict):  # another family's rotary embedding, as a layer config
        _check_rope_layer(rope, wanted, source, report, strict)
        return
    grid = trained_with["rope_reference_grid"]
    if rope is None:
        problem = (
            f"Checkpoint {source} is an EVA-02 (timm eva.py: q and v biases, a SwiGLU MLP), "
            f"trained with rotary position embeddings, which have no tensors, but the model "
            f"has none: build the model with rope=True, rope_reference_grid={grid} (timm's "
            f"for every EVA-02)."
        )
        if strict:
            raise ValueError(problem)
        report._note(f"strict=False: {problem}", logging.WARNING)
    elif (rope.reference_grid or layout.encoder.grid_size) != grid:
        report._note(
            f"the model's rope scales to a {rope.reference_grid or layout.encoder.grid_size} "
            f"grid; timm's EVA-02 are trained with rope_reference_grid={grid}."
        )


def _check_rope_layer(rope, wanted, source, report, strict):
    """`_check_rope` for a checkpoint trained with the rotary embedding layer whose
    config is `wanted` (DINOv3's): a model without it, or with another kind, is refused
    naming the switch (`strict=False`: a warning)."""
    kind = wanted["class_name"]
    has = None if rope is None else keras.saving.get_registered_name(type(rope))
    if has == kind:
        return
    problem = (
        f"Checkpoint {source} was trained with the rotary position embedding {kind}, which "
        f"has no tensors, but the model has {'none' if has is None else has}: build the "
        f"model with rope={wanted!r}."
    )
    if strict:
        raise ValueError(problem)
    report._note(f"strict=False: {problem}", logging.WARNING)


def _swiglu_checkpoint(params):
    """Whether the first block's MLP is SwiGLU: its packed fc1 (gate | up) is twice as
    wide as its fc2 takes."""
    fc1, fc2 = (params.get(BLOCK_KEY.format(i=0) + f"MlpBlock_3/Dense_{i}/kernel") for i in (0, 1))
    if fc1 is None or fc2 is None or fc1.ndim != 2 or fc2.ndim != 2:
        return False
    return fc1.shape[1] == 2 * fc2.shape[0]


def _problems(report, origin, model_shapes, checkpoint_shapes):
    def name(key):
        return key if origin.get(key, key) == key else f"{key} (from {origin[key]})"

    lines = [f"Checkpoint {report.source} ({report.format}) does not fit the model:"]
    for key in report.missing:
        lines.append(f"  missing {name(key)}: checkpoint -, model {model_shapes[key]}")
    for key in report.unexpected:
        lines.append(f"  unexpected {name(key)}: checkpoint {checkpoint_shapes[key]}, model -")
    for key, got, want in report.mismatched:
        lines.append(f"  mis-shaped {name(key)}: checkpoint {got}, model {want}")
    lines.append("Pass strict=False to load the tensors that fit and get a report.")
    return "\n".join(lines)


def _skipped(report):
    """One line on what a `strict=False` load left out."""

    def listed(keys):
        keys = [str(key) for key in keys]
        return ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")

    parts = [
        f"{len(keys)} {what} ({listed(keys)})"
        for what, keys in (
            ("missing from the checkpoint, left as they were", report.missing),
            ("unexpected, ignored", report.unexpected),
            ("mis-shaped, skipped", [key for key, _, _ in report.mismatched]),
        )
        if keys
    ]
    return f"strict=False: loaded {len(report.loaded)} tensors; " + "; ".join(parts) + "."


def load_pretrained(model, source, *, strict=True, interpolation=None, checkpoint_grid=None):
    """Loads pretrained ViT weights into a `keras_vit.ViT` model.

    `source` is a registry name (`keras_vit.list_weights()`; downloaded once into the
    cache), `hf:ORG/NAME` or `timm:NAME` (through `huggingface_hub`), an `https://` URL
    (cached too), a local path or a `gs://` URL (read through `tf.io.gfile`) of an
    official vit_jax / AugReg `.npz` (also in21k files with `pre_logits`, and gap
    files without `cls`), a `.keras` file of another `keras_vit.ViT`, a big_vision
    `.npz` (`params/`, `params/img/` or `opt/target/` prefixes, scanned blocks), an HF transformers `model.safetensors`
    (or a directory holding it, sharded too) or a timm `.safetensors`; the format is
    told from the keys.

    When the model's patch size differs from the checkpoint's, the patch embedding is
    resampled with FlexiViT's pseudo-inverse (`resample_patch_embedding`), so a /16
    checkpoint loads into a /8, /14 or /32 model. When the model's patch grid differs
    from the checkpoint's, the position embedding is resampled (see `resample_position_grid`): by default bilinearly with aligned
    corners for `.npz` files, as vit_jax does, and bicubically with antialiasing for
    HF/timm files, as timm does. A head with a different class count (or a checkpoint
    without one) is reset to zeros; `pre_logits` is dropped when the model has no
    representation layer; both are logged and listed in the report's messages. A
    part of the ViT family the checkpoint has and the model lacks (or the reverse) is
    refused naming the switch to set; so is a timm EVA-02 file for a model without
    `rope`, which has no tensors to miss.

    Args:
        model: a `keras_vit.ViT` model; its `classifier` must match the checkpoint's.
        source: the checkpoint: a `keras_vit.weights.sources.Source`, or what
            `resolve_source` resolves (a name, path or URL, as above).
        strict: if True, any missing, unexpected or mis-shaped tensor raises one
            `ValueError` that lists them all, and so do NaN or infinite values; if
            False, what fits is loaded and one logged warning (also in the report's
            messages) says what was not, another which tensors are not finite. A
            tensor that is not floating point (an integer one) is refused either way.
        interpolation: `"bilinear_align_corners"` or `"bicubic_antialias"` to override
            the default resampling method.
        checkpoint_grid: `(rows, cols)`, the patch grid the checkpoint was trained at.
            Needed only where its position table does not say it: a table whose patch
            count is the model's is read as the model's grid, another as a square grid,
            and a table that could be either is refused with a message asking for it.

    Returns:
        A `LoadReport` (keys in the official `.npz` layout).

    Example:

    >>> import os, tempfile, keras_vit
    >>> pretrained = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32,
    ...                            num_layers=2, num_heads=4, mlp_dim=64, num_classes=10)
    >>> path = os.path.join(tempfile.mkdtemp(), "vit.npz")
    >>> keras_vit.save_npz(pretrained, path)
    >>> finetune = keras_vit.ViT(image_size=48, patch_size=8, hidden_dim=32,
    ...                          num_layers=2, num_heads=4, mlp_dim=64, num_classes=5)
    >>> report = keras_vit.load_pretrained(finetune, path)
    >>> for message in report.messages:
    ...     print(message)
    the checkpoint's head has 10 classes, the model 5: the head is reset to zeros.
    position embedding resampled from a 4x4 to a 6x6 patch grid (bilinear_align_corners).
    """
    if interpolation is not None:
        posembed.check_interpolation(interpolation)
    described = resolve_source(source)
    source = described.path
    layout = _ModelLayout(model)
    if described.is_model:  # a .keras file, or a sharded run checkpoint (`epoch_NNNN.orbax`)
        (params, grid), fmt, origin, notes = _keras_file_params(source), "vit_jax", {}, []
        checkpoint_grid, trained_with = checkpoint_grid or grid, {}
    else:
        fmt, params, origin, notes, trained_with = read_official(
            source, layout.heads, layout.encoder.grid_size, checkpoint_grid
        )
    report = LoadReport(source, fmt)
    for note in notes:
        report._note(note)

    have, need = _classifiers(layout, params)
    # A class token decides the token layout; a MAP head only its pooling (strict=False
    # loads the encoder into a model that pools otherwise).
    if have != need and (strict or "token" in (have, need)):
        raise ValueError(
            f"Checkpoint {source} is a classifier={have!r} model "
            f"({'with' if have == 'token' else 'without'} a class token 'cls'"
            f"{', with a MAP head' if have == 'map' else ''}), but the "
            f"model uses classifier={need!r}: build it with classifier={have!r}."
        )
    if strict:  # otherwise the parts the model lacks are reported like other tensors
        _check_switches(layout, params, source)
    _check_rope(layout, trained_with, source, report, strict)

    checkpoint_shapes = {key: tuple(value.shape) for key, value in params.items()}
    current = layout.params()
    _resample_patches(params, current, report)
    _drop_pre_logits(layout, params, report)
    _drop_tower_parts(layout, params, report)
    forced = _reconcile_head(layout, params, current, report)
    model_shapes = {key: tuple(value.shape) for key, value in current.items()}
    learned = layout.encoder.pos_embedding.startswith("learned")
    if learned:
        model_shapes[POS_KEY] = tuple(layout.position_table().shape)

    table = params.pop(POS_KEY, None)
    position = []
    if table is not None:
        position = _position_assignments(
            layout, table, interpolation or _DEFAULT_INTERPOLATION[fmt], report, checkpoint_grid
        )
    elif learned:
        report.missing.append(POS_KEY)
    for variable in layout.unmapped:
        report.missing.append(variable.path)
        model_shapes[variable.path] = tuple(variable.shape)

    values = dict(forced)
    for key, value in current.items():
        if key in forced:
            continue
        if key not in params:
            report.missing.append(key)
            continue
        got = params.pop(key)
        if got.shape != value.shape:
            report.mismatched.append((key, tuple(got.shape), tuple(value.shape)))
        else:
            values[key] = got
            report.loaded.append(key)
    report.unexpected.extend(sorted(params))

    if report.missing or report.unexpected or report.mismatched:
        if strict:
            raise ValueError(_problems(report, origin, model_shapes, checkpoint_shapes))
        report._note(_skipped(report), logging.WARNING)
    # The model would answer nonsense (integers) or NaN (a diverged run), silently.
    loading = {origin.get(key, key): value for key, value in {**values, POS_KEY: table}.items()}
    not_float, not_finite = weight_problems(loading, source)
    if not_float:
        raise ValueError(f"{not_float}; save them as float32.")
    if not_finite and strict:
        raise NotFiniteWeights(not_finite)
    if not_finite:
        report._note(f"{not_finite}: the model will not give finite outputs.", logging.WARNING)
    layout.assign({**current, **values}, set(values))
    for variable, value in position:
        variable.assign(np.asarray(value, dtype=variable.dtype))
    report._log()
    return report


def _keras_file_params(path):
    """The weights of the ViT saved in `path` (a `.keras` file or a sharded run
    checkpoint), in the official layout, and its patch grid."""
    model = read_keras(path)
    return _official_params(model), _ModelLayout(model).encoder.grid_size


def _official_params(model):
    """A `keras_vit.ViT` model's weights by official key, the position table included."""
    layout = _ModelLayout(model)
    if layout.unmapped:
        raise ValueError(
            f"The official layout has no key for these weights of model {model.name!r}: "
            f"{', '.join(v.path for v in layout.unmapped)}."
        )
    params = layout.params()
    params[POS_KEY] = layout.position_table()
    return params


def source_defaults(weights, args):
    """`keras_vit.ViT` arguments with what a registry checkpoint or an HF model
    directory fixes filled in.

    When `weights` (a `keras_vit.weights.sources.Source`, or what `resolve_source`
    resolves) is a registry name (`timm:NAME` of one, a timm folder of one), or an HF
    transformers directory (or `hf:ORG/NAME`) whose `config.json` describes the model
    (`Source.arguments`), the architecture (unless
    `args` gives one), `image_size`, `num_classes`, `gelu_approximate` and the family
    switches (`distilled`, `layer_scale_init`, ...) left as None come from it;
    `representation_size` does not (fine-tuning drops `pre_logits`, as vit_jax does).
    A source without a classifier (a backbone or image tower) given neither
    `num_classes` nor `include_top` is built as released (`Source.arguments`, as
    `pretrained` builds it: its `pooler_output` or `image_embeds`), with the other
    `args` given. A variant other than the checkpoint's is a `ValueError`. Other
    sources leave `args` as they are.

    Example:

    >>> args = dict(variant=None, image_size=None, num_classes=10, gelu_approximate=None)
    >>> source_defaults("vit_base_patch16_224.augreg_in21k", args)
    {'variant': 'B/16', 'image_size': 224, 'num_classes': 10, 'gelu_approximate': True}
    """
    source = resolve_source(weights)
    own, weights = source.arguments, source.given
    if own is None:
        return args
    variant = args.get("variant")
    if variant is not None and own.get("variant") not in (None, variant):
        raise ValueError(
            f"weights={weights!r} are a ViT-{own['variant']} checkpoint, but variant="
            f"{variant!r}: pass variant={own['variant']!r}, or leave it out."
        )
    given = {key: value for key, value in args.items() if value is not None}
    # timm builds a classifier-less source headless (num_classes=0): the tower as released.
    if own.get("include_top") is False and not {"num_classes", "include_top"} & set(given):
        return {**own, **given}
    filled = dict(args)
    if all(args.get(key) is None for key in ARCHITECTURE):
        filled.update({key: own[key] for key in ARCHITECTURE if key in own})
    # The family switches are architecture too: the weights need them (and the position
    # embedding: DINOv3's none); not CLIP's projection, which fine-tuning drops as it
    # drops pre_logits.
    for key in ("image_size", "num_classes", "gelu_approximate", "classifier", "pos_embedding",
                *FAMILY_DEFAULTS):
        if filled.get(key) is None and key in own and key != "projection_dim":
            filled[key] = own[key]
    if filled.get("num_classes") == 0 and filled.get("include_top", True):
        raise ValueError(
            f"weights={weights!r} are an image tower without classes: pass num_classes=... "
            f"to fine-tune a head on it, or leave num_classes and include_top out (the "
            f"tower as released)."
        )
    return filled


def pretrained(name, **kwargs):
    """A ready `keras_vit.ViT` model with the weights of a registry checkpoint or of
    an HF transformers model.

    For a registry name the architecture (variant, resolution, classes, GELU,
    representation layer, the DeiT switches) comes from the registry entry
    (`keras_vit.list_weights()`); the file is downloaded once into the cache (see
    `keras_vit.weights.download`). `timm:NAME` loads timm's copy of the registry
    checkpoint `NAME` from the Hugging Face Hub instead, and a timm model folder of one
    (its hub `config.json` names it) loads that folder's file. The entry is kept as
    `model.weights_entry` (its label set and activation serve `keras_vit.classify`).

    For an HF transformers model directory (`config.json` and safetensors, as
    `save_pretrained` writes them) or `hf:ORG/NAME`, the architecture comes from its
    `config.json` (`keras_vit.weights.formats.hf_model_arguments`): ViT, DeiT and DINOv2
    (with registers too), `*ForImageClassification` (the model outputs its logits; DeiT's
    teacher form averages its two heads) or `*Model` (`pooler_output`, or the tokens
    without a pooler; DINOv2's any input size, as HF's).

    Args:
        name: a registry name, e.g. `"vit_base_patch16_384.augreg_in21k_ft_in1k"`,
            `"timm:" + name`, a timm model folder of one, an HF model directory or
            `hf:ORG/NAME` (or their `keras_vit.weights.sources.Source`).
        **kwargs: other `keras_vit.ViT` arguments that leave the weights as they are,
            e.g. `include_top=False`, `dropout_rate`, `name`.

    Returns:
        The model, weights loaded (`strict`: every tensor in its place).

    Example:

    >>> model = pretrained("vit_tiny_patch16_384.augreg_in21k_ft_in1k")  # doctest: +SKIP
    >>> model.input_shape, model.output_shape  # doctest: +SKIP
    ((None, 384, 384, 3), (None, 1000))
    >>> pretrained("hf:facebook/deit-tiny-distilled-patch16-224").output_shape  # doctest: +SKIP
    (None, 1000)
    """
    try:
        source = resolve_source(name)
    except FileNotFoundError:  # a folder that holds no checkpoint: say what pretrained needs
        if isinstance(name, (str, os.PathLike)) and os.path.isdir(name):
            raise _not_a_model_folder(os.fspath(name)) from None
        raise
    given = source.given
    # An HF folder, or a timm folder its family reads, describes its own architecture.
    own_config = source.kind == "timm_directory" and source.arguments is not None
    if source.kind in ("hf", "hf_directory") or own_config:
        arguments = source.arguments
        # What leaves the weights as they are may be changed.
        free = {"include_top", "pooling", "dynamic_image_size", "pos_interpolation", "naflex"}
        clashes = sorted(set(kwargs) & (set(arguments) - free))
        if clashes:
            raise ValueError(
                f"pretrained() takes {', '.join(clashes)} from {source.path}/config.json; to "
                f"change them, fine-tune: keras_vit.ViT(weights={given!r}, "
                f"{', '.join(f'{k}=...' for k in clashes)})."
            )
        model = VisionTransformer(**{**arguments, **kwargs})
        load_pretrained(model, source)
        return model
    entry = source.entry
    if entry is None and os.path.isdir(source.location) and source.kind != "timm_directory":
        raise _not_a_model_folder(given)
    if entry is None:
        raise ValueError(
            f"pretrained({given!r}) takes a registry name (keras-vit weights lists them), "
            "timm:NAME of one, an HF model directory or hf:ORG/NAME; for other weights "
            "build the model and load them: "
            f"keras_vit.ViT(VARIANT, weights={given!r}, image_size=..., num_classes=...)."
        )
    arguments = source.arguments
    clashes = sorted(set(kwargs) & set(arguments))
    if clashes:
        raise ValueError(
            f"pretrained() takes {', '.join(clashes)} from the registry entry {entry.name!r}; "
            f"to change them, fine-tune: keras_vit.ViT({entry.variant!r}, weights="
            f"{entry.name!r}, {', '.join(f'{k}=...' for k in clashes)})."
        )
    model = VisionTransformer(**arguments, **kwargs)
    try:
        load_pretrained(model, source)
    except NotFiniteWeights:  # the entry's checkpoint, diverged: not a wrong download
        raise
    except ValueError as err:
        # The model is the entry's own: a file that does not fit is a wrong download.
        refused = refuse_cached(entry, kwargs) if source.kind == "registry" else None
        if refused is None:
            raise
        raise ValueError(f"{err}\n{refused}") from None
    model.weights_entry = entry
    return model


def _not_a_model_folder(folder):
    return ValueError(
        f"{folder} is not an HF transformers model directory: pretrained() "
        "needs its config.json and model.safetensors, as save_pretrained writes them."
    )


def save_npz(model, path):
    """Saves a `keras_vit.ViT` model's weights as an official vit_jax `.npz`.

    The file has the layout of the released checkpoints (query/key/value kernels
    `(D, heads, head_dim)`, `embedding/kernel` `(P, P, C, D)`, the position table with
    its class-token row, ...), so vit_jax, big_vision and timm load it, and
    `load_pretrained` restores it exactly. `path` may be a `gs://` URL; the file is
    written under a temporary name and renamed into place (`keras_vit.utils.files`).

    Example:

    >>> import os, tempfile, keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> path = os.path.join(tempfile.mkdtemp(), "vit.npz")
    >>> keras_vit.save_npz(model, path)
    >>> query = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
    >>> np.load(path)[query].shape
    (32, 4, 8)
    """
    buffer = io.BytesIO()
    np.savez(buffer, **_official_params(model))
    atomic_write(os.fspath(path), buffer.getvalue())
