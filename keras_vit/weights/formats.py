"""Reading ViT checkpoints of every supported layout into the official vit_jax layout.

The official layout is the keys of the released vit_jax `.npz` files (`cls`,
`embedding/kernel`, `Transformer/posembed_input/pos_embedding`,
`Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1/query/kernel`, ...).
big_vision `.npz` files and HF transformers / timm safetensors are converted to it:
one reader per format, the HF and timm ones by the key renames, conversions and HF
config readings that the families of `keras_vit.families` declare (this module knows
no family by name); `keras_vit.weights.pretrained` maps the layout onto a model.
Paths may be local or URLs such as `gs://...` (read through `tf.io.gfile`).
"""

import io
import json
import math
import re

import ml_dtypes
import numpy as np

from keras_vit.families import FAMILIES
from keras_vit.families.family import POS_KEY, QKV, rotate_half_order
from keras_vit.utils import paths

# ---------------------------------------------------------------------------
# Files: local paths, or gs:// and other URLs through TensorFlow's file systems.


def _read_json(path):
    """The JSON object in the file `path`; a file that holds none is a `ValueError`
    naming it and what is wrong."""
    try:
        value = json.loads(paths.read_bytes(path))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(
            f"{path} is not valid JSON ({err}); save the model again with save_pretrained, "
            "or correct the file."
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"{path} holds a JSON {type(value).__name__}, not an object of settings; save the "
            "model again with save_pretrained, or correct the file."
        )
    return value


SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")


def holds_safetensors(directory):
    """Whether `directory` is an HF-style model folder: it holds `model.safetensors` or
    a sharded `model.safetensors.index.json` (beside the `config.json` of a transformers
    model, which alone does not tell it from a keras-vit run folder)."""
    return paths.isdir(directory) and any(paths.exists(paths.join(directory, n)) for n in SAFETENSORS_FILES)


def _checkpoint_files(source):
    if paths.isdir(source):
        single, index = (paths.join(source, name) for name in SAFETENSORS_FILES)
        if paths.exists(single):
            return [single]
        if paths.exists(index):
            shards = _read_json(index)["weight_map"].values()
            return [paths.join(source, name) for name in sorted(set(shards))]
        raise FileNotFoundError(
            f"Directory {source} holds no model.safetensors or model.safetensors.index.json."
        )
    if not paths.exists(source):
        raise FileNotFoundError(f"Checkpoint {source} does not exist.")
    return [source]


_SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
}


def _safetensors_arrays(data):
    import safetensors

    arrays = {}
    for name, view in safetensors.deserialize(data):
        if view["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r} has the unsupported dtype {view['dtype']}")
        dtype = _SAFETENSORS_DTYPES[view["dtype"]]
        arrays[name] = np.frombuffer(view["data"], dtype).reshape(view["shape"])
    return arrays


class NotAnArray(ValueError):
    """A checkpoint member that is not a numeric array."""


def _npz_member(npz, key, path):
    """One member of an .npz archive, which must be a numeric array: `np.load` gives
    other members (a text file) as bytes, and refuses pickled object arrays."""
    try:
        value = npz[key]
    except ValueError as err:  # an object array (loading it would run pickled code)
        reason = str(err)
    else:
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            return value
        is_array = isinstance(value, np.ndarray)
        reason = f"its dtype is {value.dtype}" if is_array else "it is a file, not an .npy array"
    raise NotAnArray(
        f"Cannot read checkpoint {path}: its member {key!r} is not a numeric array ({reason}); "
        "a checkpoint holds numeric arrays only: save it again with numpy.savez of arrays."
    )


def _read_arrays(path):
    data = paths.read_bytes(path)
    try:
        if data[:4] == b"PK\x03\x04":  # .npz files are zip archives
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                return {key: _npz_member(npz, key, path) for key in npz.files}
        return _safetensors_arrays(data)
    except NotAnArray:
        raise
    except Exception as err:  # every reader's own error becomes one that names the file
        raise ValueError(
            f"Cannot read checkpoint {path}: it is truncated or corrupt, or neither an .npz "
            f"nor a .safetensors file ({type(err).__name__}: {err})."
        ) from err


# ---------------------------------------------------------------------------
# Source layouts -> the official vit_jax layout.


def _split_heads(x, heads, axis):
    # A width the model's heads do not divide is left whole for the shape check to report.
    if x.shape[axis] % heads:
        return x
    return x.reshape(*x.shape[:axis], heads, -1, *x.shape[axis + 1 :])


def _convert(kind, target, param, value, heads):
    """One torch tensor as `[(official key, array)]`; torch Linear weights are (out, in)."""
    if kind in ("copy", "scale"):
        return [(target, value)]
    if kind in ("token", "rows"):  # HF's (D,) class token and (N, D) table: (1, ., D)
        return [(target, value.reshape((1,) * (3 - value.ndim) + value.shape))]
    if kind == "norm":
        return [(f"{target}/{'scale' if param == 'weight' else 'bias'}", value)]
    if param == "bias":
        if kind in _FUSED:
            names = _FUSED[kind]
            return [
                (f"{target}/{name}/bias", _interleaved(kind, name, _split_heads(part, heads, 0)))
                for name, part in zip(names, np.split(value, len(names)))
            ]
        split = _split_heads(value, heads, 0) if kind == "heads_in" else value
        return [(f"{target}/bias", split)]
    if kind == "conv":
        return [(f"{target}/kernel", value.transpose(2, 3, 1, 0))]
    kernel = value.T
    if kind in _FUSED:
        names = _FUSED[kind]
        return [
            (f"{target}/{name}/kernel", _interleaved(kind, name, _split_heads(part, heads, 1)))
            for name, part in zip(names, np.split(kernel, len(names), axis=1))
        ]
    if kind == "heads_in":
        kernel = _split_heads(kernel, heads, 1)
    elif kind == "heads_out":
        kernel = _split_heads(kernel, heads, 0)
    return [(f"{target}/kernel", kernel)]


# Fused projections: q|k|v (and timm's MAP head's k|v), split into the official ones.
_FUSED = {"qkv": QKV, "kv": QKV[1:], "qkv_rotate_half": QKV}


def _interleaved(kind, name, part):
    """A query or key part of a "qkv_rotate_half" projection, split by heads (last axis
    `head_dim`), with each head's channels in `rotate_half_order`; other parts as they are."""
    if kind != "qkv_rotate_half" or name == "value" or part.ndim < 2:
        return part
    return part[..., rotate_half_order(part.shape[-1])]


def _expected_ndim(kind, param):
    if kind in ("token", "rows"):
        return 1 if kind == "token" else 2
    if kind == "copy":
        return 3
    if param == "bias" or kind in ("norm", "scale"):
        return 1
    return 4 if kind == "conv" else 2


def _divisible(kind, value):
    return kind not in _FUSED or value.shape[0] % len(_FUSED[kind]) == 0


def _unique(items):
    """`items` without repeats, in order (families share some rows, as SigLIP CLIP's)."""
    return list(dict.fromkeys(items))


def _rules(column):
    """`(pattern, official target, conversion)` for one format (`"hf"` or `"timm"`) of
    every family's `TorchName`s."""
    rules = []
    for name in _unique(row for family in FAMILIES for row in family.torch_names):
        pattern = getattr(name, column)
        if pattern is not None:
            whole = name.kind in ("copy", "scale", "token", "rows")
            suffix = "" if whole else r"\.(?P<param>weight|bias)"
            rules.append((pattern + suffix, name.target, name.kind))
    return rules


_HF_RULES, _TIMM_RULES = _rules("hf"), _rules("timm")
# The module names HF puts in front of a model's tensors (`dinov2.`, `vision_model.`).
_HF_PREFIX = "(" + "|".join(_unique(p for family in FAMILIES for p in family.hf_prefixes)) + r")\."
_HF_RENAMES = [("^" + _HF_PREFIX, "")] + _unique(
    rename for family in FAMILIES for rename in family.hf_renames
)
# The text tower and the contrastive scalars of a full SiglipModel / CLIPModel file.
_HF_TEXT_TOWER = r"(text_model\.|text_projection\.|logit_scale$|logit_bias$)"


# HF transformers architectures keras-vit builds, each with its family.
_HF_FAMILIES = {
    architecture: family for family in FAMILIES for architecture in family.hf_architectures
}
# HF `hidden_act` -> `gelu_approximate` (`quick_gelu`: CLIP's, `quick_gelu=True`).
_HF_GELU = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True, "quick_gelu": False}


def _checkpoint_shapes(source):
    """The tensor shapes of a checkpoint file or directory by name, read from the
    headers of local safetensors files (other files are read whole)."""
    import safetensors

    shapes = {}
    for path in _checkpoint_files(source):
        if paths.is_url(path) or not path.endswith(".safetensors"):
            shapes.update((key, value.shape) for key, value in _read_arrays(path).items())
        else:
            with safetensors.safe_open(path, "np") as f:
                shapes.update((key, tuple(f.get_slice(key).get_shape())) for key in f.keys())
    return shapes


def _check_model_type(path, config, architecture):
    """Raises a `ValueError` naming `path` when its `model_type` is not the one its
    architecture (`architectures[0]`) writes (its family's `hf_model_types`)."""
    types = _HF_FAMILIES[architecture].hf_model_types
    expected = types[max((name for name in types if architecture.startswith(name)), key=len)]
    model_type = config.get("model_type")
    if model_type not in expected:
        given = "has no model_type" if model_type is None else f"has model_type={model_type!r}"
        raise ValueError(
            f"{path} {given}, but its architecture {architecture} is a {expected[0]!r} "
            f"model: the file contradicts itself; save the model again with save_pretrained, "
            f"or correct model_type."
        )


def _check_config_fits_tensors(path, args, shapes):
    """Raises a `ValueError` naming both when the `config.json` at `path` (read into the
    `keras_vit.ViT` arguments `args`) disagrees with the tensors (`shapes`, by name) it
    describes: their patch size, width, channels, patch grid or classes. transformers
    refuses such a folder; keras-vit would resample the weights to the config, silently."""
    tokens = sum(bool(re.fullmatch(r"(\w+\.)?embeddings\.(cls_token|distillation_token|"
                                   r"class_embedding)", key)) for key in shapes)
    for key, shape in shapes.items():
        name = re.sub("^" + _HF_PREFIX, "", key)
        # (config key, its value, whether the tensor fits it, what the tensor holds)
        found = []
        patch_kernel = re.fullmatch(r"embeddings\.patch_embeddings?(\.projection)?\.weight", name)
        if patch_kernel and len(shape) == 4:
            found = [
                ("patch_size", args["patch_size"], args["patch_size"] == shape[2] == shape[3],
                 f"{shape[2]}x{shape[3]} patches"),
                ("hidden_size", args["hidden_dim"], args["hidden_dim"] == shape[0],
                 f"width {shape[0]}"),
                ("num_channels", args["channels"], args["channels"] == shape[1],
                 f"{shape[1]} channels"),
            ]
        elif re.fullmatch(r"embeddings\.position_embeddings?(\.weight)?", name) and shape:
            size, patch = args["image_size"], args["patch_size"]
            if isinstance(size, int) and isinstance(patch, int):
                rows, patches = shape[-2] - tokens, (size // patch) ** 2
                found = [("image_size", size, rows == patches,
                          f"{rows} patch positions, not the {patches} of that size")]
        elif re.fullmatch(r"(cls_)?classifier\.weight", name) and "num_classes" in args:
            found = [("num_labels", args["num_classes"], args["num_classes"] == shape[0],
                      f"{shape[0]} classes")]
        for config_key, given, fits, what in found:
            if not fits:
                raise ValueError(
                    f"{path} says {config_key}={given}, but its weights' {key} {tuple(shape)} "
                    f"hold {what}: the config and the weights disagree (transformers refuses "
                    "them too); save the model again with save_pretrained, or correct the "
                    "config."
                )


def hf_model_arguments(source):
    """The `keras_vit.ViT` arguments of the HF transformers model saved in the
    directory `source` (`config.json` beside its safetensors, as `save_pretrained`
    writes them): ViT, DeiT and DINOv2 (with registers too), `*ForImageClassification`
    (DeiT's teacher form too) and `*Model`; the vision towers `SiglipVisionModel` and
    `CLIPVisionModel` (their `pooler_output`), `CLIPVisionModelWithProjection`
    (`image_embeds`), and the image side of a full `SiglipModel` or `CLIPModel` (its
    `vision_config`); SigLIP 2's NaFlex `Siglip2VisionModel` and `Siglip2Model`
    (`naflex=True`).

    Raises a `ValueError` naming what keras-vit cannot build (another architecture,
    activation, or attention without biases).

    Example:

    >>> hf_model_arguments("deit-tiny-distilled")["distilled"]  # doctest: +SKIP
    True
    """
    path = paths.join(source, "config.json")
    if not paths.isdir(source) or not paths.exists(path):
        raise ValueError(
            f"{source} is not an HF transformers model directory: it holds no config.json "
            "(save the model with save_pretrained, or pass hf:ORG/NAME)."
        )
    top = _read_json(path)
    architectures = top.get("architectures") or []
    architecture = architectures[0] if architectures else None
    if architecture not in _HF_FAMILIES:
        raise ValueError(
            f"{path} describes a {architecture or top.get('model_type')!r} model: "
            f"keras-vit builds {', '.join(_HF_FAMILIES)}."
        )
    _check_model_type(path, top, architecture)
    family = _HF_FAMILIES[architecture]
    # A full image-text model's vision tower has a config of its own.
    config = {**family.hf_config_defaults, **top.get("vision_config", top)}
    extra = {} if family.hf_arguments is None else family.hf_arguments(config, top, architecture)
    activation = config.get("hidden_act", "gelu")
    # A SwiGLU's activation is its gate's, which the family checks (DINOv3's `silu`).
    if activation not in _HF_GELU and extra.get("mlp") != "swiglu":
        raise ValueError(
            f"{path} has hidden_act={activation!r}: keras-vit builds {', '.join(_HF_GELU)}."
        )
    if not config.get("qkv_bias", True):
        raise ValueError(f"{path} has qkv_bias=false: keras-vit's attention has biases.")
    hidden = config.get("hidden_size", 768)
    args = dict(
        image_size=config.get("image_size", 224),
        patch_size=config.get("patch_size", 16),
        hidden_dim=hidden,
        num_layers=config.get("num_hidden_layers", 12),
        num_heads=config.get("num_attention_heads", 12),
        mlp_dim=config.get("intermediate_size", 3072),
        channels=config.get("num_channels", 3),
        # transformers' own default, which config.json leaves out when it is used.
        layer_norm_epsilon=config.get("layer_norm_eps", 1e-12),
        gelu_approximate=_HF_GELU.get(activation, False),
        **family.hf_architectures[architecture],
    )
    if activation == "quick_gelu":
        args["quick_gelu"] = True
    args.update(extra)
    shapes = _checkpoint_shapes(source)
    if args.get("include_top", True):
        args["num_classes"] = len(config.get("id2label") or {}) or config.get("num_labels", 2)
    elif any(re.match(f"({_HF_PREFIX})?pooler\\.", key) for key in shapes):
        if config.get("pooler_act", "tanh") != "tanh":
            raise ValueError(
                f"{path} has pooler_act={config['pooler_act']!r}: keras-vit's pre_logits is tanh."
            )
        args["representation_size"] = config.get("pooler_output_size", hidden)
    elif not family.hf_pools:
        args["pooling"] = False  # last_hidden_state
    _check_config_fits_tensors(path, args, shapes)
    preprocessing = hf_preprocessing(source)
    if preprocessing is not None:
        args["preprocessing"] = preprocessing
    return args


def timm_model_arguments(source):
    """The `keras_vit.ViT` arguments of the timm model folder `source` (`config.json`
    beside `model.safetensors`, as timm's `save_for_hf` writes them: `architecture`,
    `model_args`, `pretrained_cfg`), as the family of its architecture reads them (its
    `timm_arguments`), with the preprocessing of its `pretrained_cfg`; None when no
    family builds the architecture from its config."""
    config = _read_json(paths.join(source, "config.json"))
    architecture, model_args = config.get("architecture"), config.get("model_args") or {}
    for family in FAMILIES:
        args = None if family.timm_arguments is None else family.timm_arguments(
            architecture, model_args)
        if args is not None:
            preprocessing = timm_preprocessing(source)
            return args if preprocessing is None else {**args, "preprocessing": preprocessing}
    return None


def timm_preprocessing(source):
    """The preprocessing dict of the timm model folder `source`, from its config.json's
    `pretrained_cfg` (`mean`, `std`, `interpolation`, `crop_pct`), or None without one;
    a resize keras-vit does not apply is a `ValueError` naming it."""
    path = paths.join(source, "config.json")
    cfg = _read_json(path).get("pretrained_cfg") or {}
    if not {"mean", "std"} <= set(cfg):
        return None
    interpolation = cfg.get("interpolation", "bicubic")
    if interpolation not in _PIL_RESAMPLE.values():
        raise ValueError(
            f"{path} has interpolation={interpolation!r}: keras-vit resizes with "
            f"{' or '.join(_PIL_RESAMPLE.values())}."
        )
    crop = cfg.get("crop_pct")
    # timm resizes with PIL, which antialiases.
    return dict(mean=cfg["mean"], std=cfg["std"], interpolation=interpolation, antialias=True,
                crop_fraction=None if crop is None else float(crop))


# PIL's resampling filters by number, as HF image-processor configs store them (PIL's
# resize antialiases: its filter widens when shrinking).
_PIL_RESAMPLE = {2: "bilinear", 3: "bicubic"}


def hf_preprocessing(source):
    """The preprocessing dict (`keras_vit.models.preprocessing`) of the HF model
    directory `source`, read from its `preprocessor_config.json`, or None without one.

    `image_mean` / `image_std` (0 and 1 with `do_normalize` false), `resample` (PIL's
    2 bilinear or 3 bicubic, both antialiased as PIL's resize is) and the crop:
    `crop_size` over `size` with `do_center_crop` (HF's DeiT: 224 of 256, 0.875), else
    `crop_pct`, else the whole image. HF resizes to `size` before its crop, keras-vit
    resizes the short side: the same on square images. Anything else it cannot apply is a `ValueError` naming it.
    """
    path = paths.join(source, "preprocessor_config.json")
    if not paths.exists(path):
        return None
    config = _read_json(path)
    normalized = config.get("do_normalize", True)
    rescale = config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else None
    if rescale is None or not math.isclose(rescale, 1 / 255, rel_tol=1e-6):
        raise ValueError(
            f"{path} has do_rescale={config.get('do_rescale', True)}, rescale_factor="
            f"{config.get('rescale_factor')}: keras-vit scales 8-bit pixels by 1/255."
        )
    resample = config.get("resample", 2)
    if resample not in _PIL_RESAMPLE:
        raise ValueError(
            f"{path} has resample={resample!r}: keras-vit resizes with PIL's bilinear (2) "
            "or bicubic (3)."
        )
    crop_fraction = None
    if config.get("do_center_crop") and config.get("crop_size"):
        crop, size = config["crop_size"], config.get("size") or {}
        side = size.get("shortest_edge") or size.get("height")
        crop_side = crop.get("height") if isinstance(crop, dict) else crop
        if side and crop_side:
            crop_fraction = min(1.0, crop_side / side)
    elif config.get("crop_pct") is not None:
        crop_fraction = float(config["crop_pct"])
    return dict(
        mean=config.get("image_mean", (0.5, 0.5, 0.5)) if normalized else (0.0, 0.0, 0.0),
        std=config.get("image_std", (0.5, 0.5, 0.5)) if normalized else (1.0, 1.0, 1.0),
        interpolation=_PIL_RESAMPLE[resample],
        antialias=True,
        crop_fraction=crop_fraction,
    )


def _from_torch_layout(arrays, rules, renames, heads):
    params, origin = {}, {}
    for source, value in arrays.items():
        key = source
        for pattern, replacement in renames:
            key = re.sub(pattern, replacement, key)
        for pattern, target, kind in rules:
            match = re.fullmatch(pattern, key)
            if match:
                groups = match.groupdict()
                param = groups.pop("param", None)
                if value.ndim == _expected_ndim(kind, param) and _divisible(kind, value):
                    target = target.format(**groups)
                    for official, array in _convert(kind, target, param, value, heads):
                        params[official], origin[official] = array, source
                    break
        else:  # kept under its own name, so the checks report it as unexpected
            params[source], origin[source] = value, source
    return params, origin


# big_vision's image-text models (SigLIP) hold the image tower under `img/` (HF's copies of
# the release drop `params/`).
_NPZ_PREFIXES = ("opt/target/", "params/img/", "img/", "params/")
# big_vision's Linen modules are numbered without the dropout layers vit_jax counts.
_BIG_VISION_RENAMES = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def _holds_prefix_rows(rows, prefix, grid, checkpoint_grid=None, label=None):
    """Whether a position table of `rows` rows, of a model with `prefix` tokens in front
    of the patches (class, distillation), starts with a row for each of them.

    big_vision, and timm's `no_embed_class` models (DeiT III), add the table before
    prepending the tokens (no such rows); vit_jax, older big_vision files and the other
    timm models hold them first. The checkpoint's own grid, where the caller gives it,
    decides; else the model's patch grid (`(rows, cols)` or None) when one reading fits
    it; otherwise the reading whose patch count is square, as released checkpoints are.
    For big_vision (`label`), whose tables hold no such rows, that guess is refused
    where the rows would also make a grid of their own (10 rows: 3x3 after a class
    row, or 2x5)."""
    if checkpoint_grid is not None:
        patches = checkpoint_grid[0] * checkpoint_grid[1]
        if rows not in (patches, patches + prefix):
            raise ValueError(
                f"checkpoint_grid={tuple(checkpoint_grid)} has {patches} patches, but the "
                f"{label} position table has {rows} rows: pass the grid it was trained at."
            )
        return rows == patches + prefix
    if grid is not None:
        patches = grid[0] * grid[1]
        if rows in (patches, patches + prefix):
            return rows == patches + prefix
    side = math.isqrt(rows - prefix)
    holds = side**2 + prefix == rows and math.isqrt(rows) ** 2 != rows
    grids = [f"{a}x{rows // a}" for a in range(2, math.isqrt(rows) + 1) if rows % a == 0]
    if holds and label == "big_vision" and grids:
        raise ValueError(
            f"Cannot tell the patch grid of big_vision's {rows}-row position table: a "
            f"{side}x{side} grid after a class-token row, or {' or '.join(grids)} without "
            "one; pass the grid it was trained at: load_pretrained(..., "
            "checkpoint_grid=(rows, cols))."
        )
    return holds


def _add_prefix_rows(params, notes, grid, source, checkpoint_grid=None):
    """Puts zero rows for the class (and distillation) tokens in front of a position
    table that has none, so that every layout holds them as vit_jax's does."""
    prefix = ("cls" in params) + ("dist" in params)
    table = params.get(POS_KEY)
    if not prefix or table is None or table.ndim != 3 or table.shape[1] <= prefix:
        return
    if _holds_prefix_rows(table.shape[1], prefix, grid, checkpoint_grid, source):
        return
    params[POS_KEY] = np.concatenate([np.zeros_like(table[:, :prefix]), table], axis=1)
    notes.append(
        f"{source} adds no position embedding to the class token"
        + (" and the distillation token" if prefix > 1 else "")
        + ": its position row is set to zero."
    )


def _from_big_vision(params, origin, notes, grid=None, checkpoint_grid=None):
    out, out_origin = {}, {}
    for key, value in params.items():
        scanned = re.fullmatch(r"Transformer/encoderblock/(.+)", key)
        if scanned:  # nn.scan stacks the blocks on a leading depth axis
            entries = [
                (f"Transformer/encoderblock_{i}/{scanned[1]}", layer, f"{origin[key]}[{i}]")
                for i, layer in enumerate(value)
            ]
        else:
            entries = [(key, value, origin[key])]
        for name, array, source in entries:
            parts = re.fullmatch(r"(Transformer/encoderblock_\d+/)([^/]+)(/.+)", name)
            if parts and parts[2] in _BIG_VISION_RENAMES:
                name = parts[1] + _BIG_VISION_RENAMES[parts[2]] + parts[3]
            out[name], out_origin[name] = array, source
    for name in ("pos_embedding", "Transformer/pos_embedding"):
        if name in out:
            out[POS_KEY], out_origin[POS_KEY] = out.pop(name), out_origin.pop(name)
            _add_prefix_rows(out, notes, grid, "big_vision", checkpoint_grid)
    return out, out_origin


def _text_tower_note(count):
    return f"the text tower's {count} tensors are not loaded (an image model)."


def _unknown_layout(source, keys):
    keys = sorted(keys)
    raise ValueError(
        f"Unknown checkpoint layout in {source}: expected an official ViT / AugReg or "
        f"big_vision .npz, or HF transformers or timm ViT safetensors. It holds {len(keys)} "
        f"tensors, e.g. {', '.join(keys[:8])}."
    )


def _from_npz(arrays, source, grid=None, checkpoint_grid=None):
    prefix = next((p for p in _NPZ_PREFIXES if any(k.startswith(p) for k in arrays)), "")
    params = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    origin = {k[len(prefix):]: k for k in arrays if k.startswith(prefix)}
    notes = []
    for key, value in params.items():
        # Some hybrid files keep GroupNorm parameters with singleton dims, (1, 1, 1, C).
        if re.fullmatch(r"(gn_root|block\d+/unit\d+/gn(\d|_proj))/(scale|bias)", key):
            params[key] = value.reshape(-1)
    # The text tower and the contrastive scalars (`t`, `b`) beside an image tower.
    text = [k for k in arrays if prefix.endswith("img/")
            and re.fullmatch(re.escape(prefix[: -len("img/")]) + r"(txt/.*|t|b)", k)]
    if text:
        notes.append(_text_tower_note(len(text)))
    if len(params) + len(text) < len(arrays):
        notes.append(f"ignored {len(arrays) - len(params) - len(text)} tensors outside {prefix!r}.")
    big_vision = any(
        k in ("pos_embedding", "Transformer/pos_embedding")
        or k.startswith("Transformer/encoderblock/")
        or re.match(r"Transformer/encoderblock_\d+/MultiHeadDotProductAttention_0/", k)
        for k in params
    )
    if big_vision:
        params, origin = _from_big_vision(params, origin, notes, grid, checkpoint_grid)
    if "embedding/kernel" not in params and not any(
        k.startswith("Transformer/encoderblock_") for k in params
    ):
        _unknown_layout(source, arrays)
    return ("big_vision" if big_vision else "vit_jax"), params, origin, notes


def read_official(source, heads, grid=None, checkpoint_grid=None):
    """Reads a checkpoint file or HF directory in the official layout.

    Args:
        source: local path or URL of an .npz or .safetensors file, or of a directory
            holding `model.safetensors` (or a sharded `model.safetensors.index.json`).
        heads: attention heads, to split the fused (D, D) projections of HF and timm
            into the official (D, heads, head_dim) kernels.
        grid: the patch grid `(rows, cols)` of the model the weights are for, which
            tells whether a big_vision or timm position table holds rows for the class
            (and distillation) tokens.
        checkpoint_grid: the patch grid `(rows, cols)` the checkpoint was trained at,
            where it is known: it decides that over the model's grid.

    Returns:
        `(format, params, origin, notes, trained_with)`: the format name (`"vit_jax"`,
        `"big_vision"`, `"hf"` or `"timm"`), the tensors by official key, the source key
        of each official key, notes on what was ignored or adapted, and the
        `keras_vit.ViT` arguments the checkpoint was trained with that no tensor shows
        (EVA-02's rope: the families' `timm_layout`), as far as its keys tell them.
    """
    arrays = {}
    for path in _checkpoint_files(source):
        arrays.update(_read_arrays(path))
    if any("/" in key for key in arrays):
        return (*_from_npz(arrays, source, grid, checkpoint_grid), {})
    # timm's ViT and its NaFlexVit (a Linear on flattened patches).
    if "patch_embed.proj.weight" in arrays or "embeds.proj.weight" in arrays:
        notes, trained_with = [], {}
        for family in FAMILIES:
            if family.timm_layout is not None:
                trained_with.update(family.timm_layout(arrays, notes))
        params, origin = _from_torch_layout(arrays, _TIMM_RULES, [], heads)
        _add_prefix_rows(params, notes, grid, "timm's no_embed_class model", checkpoint_grid)
        return "timm", params, origin, notes, trained_with
    if any(re.match(
        f"({_HF_PREFIX})?embeddings\\.patch_embeddings?\\.", key) for key in arrays
    ):
        text = [key for key in arrays if re.match(_HF_TEXT_TOWER, key)]
        notes = [_text_tower_note(len(text))] if text else []
        # DINOv2's mask token stands in for masked patches in pretraining only.
        masks = [key for key in arrays if re.fullmatch(r"(\w+\.)?embeddings\.mask_token", key)]
        notes += [f"{key} (masked-image pretraining only) is not used at inference: ignored."
                  for key in masks]
        vision = {key: value for key, value in arrays.items() if key not in set(text + masks)}
        trained_with = {}
        for family in FAMILIES:
            if family.hf_layout is not None:
                trained_with.update(family.hf_layout(vision, notes))
        params, origin = _from_torch_layout(vision, _HF_RULES, _HF_RENAMES, heads)
        return "hf", params, origin, notes, trained_with
    _unknown_layout(source, arrays)
