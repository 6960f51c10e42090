"""Every PNG figure keras-vit draws (matplotlib): analysis, probes, few-shot, training.

The charts of evaluation results (`plot_probes`, `plot_fewshot`) are drawn by
`keras_vit.evaluation.charts`, below evaluation, which writes them with its numbers;
they are named here with the rest. Figures are drawn with matplotlib's object-oriented
API on the Agg canvas, so importing this module neither needs a display nor changes
pyplot's backend. `keras_vit` itself does not import matplotlib; only this module and
the charts do.
"""

from pathlib import Path

import keras
import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from keras_vit.evaluation import analysis
from keras_vit.evaluation.charts import (  # noqa: F401  (the charts: figures too)
    plot_fewshot,
    plot_probes,
    save_figure,
)
from keras_vit.layers.pooling import MAPHead
from keras_vit.models.vit import vit_parts


def _display_image(image):
    """An image in [-1, 1] as something `imshow` draws: RGB in [0, 1] or grey."""
    image = np.asarray(image, dtype="float32")
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(
            f"Expected one image of shape (height, width, 1 or 3), got shape {image.shape}."
        )
    image = np.clip((image + 1.0) / 2.0, 0.0, 1.0)
    return (image[..., 0], "gray") if image.shape[-1] == 1 else (image, None)


def _scaled(values):
    """Scales to [0, 1] by the maximum, so each panel shows its own structure."""
    top = values.max()
    return values / top if top > 0 else values


def plot_attention_maps(image, attentions, grid_size, path, head_fusion="mean", prefix_tokens=None,
                        pooling=None):
    """Draws, over `image`, each layer's attention map and the rollout up to it.

    Top row: the head-fused attention of the layer alone (the class token's row,
    the mean row of a `gap` model, or the rows the MAP head's probe reads with its
    `pooling` attention, see `analysis.attention_map`). Bottom row:
    the attention rollout through that layer. The first column shows the image
    and the image weighted by the full rollout (as in the paper's Fig. 6). Each
    map is scaled to its own maximum.

    Args:
        image: `(height, width, channels)` in [-1, 1], the image the attention is of.
        attentions: per-layer attention weights `(batch, heads, T, T)`; only the
            first example of the batch is drawn, so it must be `image`'s.
        grid_size: `(rows, cols)` of the patch grid.
        path: PNG file to write.
        head_fusion: `"mean"`, `"max"` or `"min"` over heads.
        prefix_tokens: the tokens before the patches (see `analysis.attention_map`).
        pooling: a `map` model's MAP-head attention `(batch, heads, T)`
            (`analysis.attention_model(model, pooling=True)`); the first panel then
            shows the probe's own attention over the patches.

    Example:

    >>> attention = np.full((1, 2, 17, 17), 1 / 17)
    >>> plot_attention_maps(np.zeros((32, 32, 3)), [attention] * 2, (4, 4),
    ...                     "/tmp/attention.png").name
    'attention.png'
    """
    pixels, cmap = _display_image(image)
    height, width = pixels.shape[:2]
    stacked = [np.asarray(a)[:1] for a in attentions]
    depth = len(stacked)
    final = analysis.attention_rollout(stacked, head_fusion)  # validates the arguments
    fused = getattr(np, head_fusion)(np.stack(stacked), axis=2)
    probe = None if pooling is None else np.asarray(pooling)[:1]

    def attention_map(matrix):
        return analysis.attention_map(matrix, grid_size, prefix_tokens, probe)[0]

    layer_maps = [attention_map(f) for f in fused]
    rollout_maps = [
        attention_map(analysis.attention_rollout(stacked[: i + 1], head_fusion))
        for i in range(depth)
    ]
    fig = Figure(figsize=(1.9 * (depth + 1) + 0.8, 4.4), layout="constrained")
    axes = fig.subplots(2, depth + 1, squeeze=False)
    # imshow puts pixel centres on integers, so the image spans -0.5 .. size - 0.5.
    overlay = dict(extent=(-0.5, width - 0.5, height - 0.5, -0.5), cmap="inferno", alpha=0.65,
                   vmin=0, vmax=1, interpolation="bilinear")
    axes[0, 0].imshow(pixels, cmap=cmap)
    axes[0, 0].set_title("input")
    if probe is not None:
        axes[0, 0].imshow(_scaled(analysis.attention_map(None, grid_size, prefix_tokens, probe)[0]),
                          **overlay)
        axes[0, 0].set_title("MAP head probe")
    mask = _scaled(attention_map(final))
    mask = np.kron(mask, np.ones((height // mask.shape[0], width // mask.shape[1])))
    weighted = pixels * (mask[..., None] if pixels.ndim == 3 else mask)
    axes[1, 0].imshow(weighted, cmap=cmap, vmin=0, vmax=1)
    axes[1, 0].set_title("input x rollout")
    for i in range(depth):
        for row, maps, label in ((0, layer_maps, "attention"), (1, rollout_maps, "rollout")):
            ax = axes[row, i + 1]
            ax.imshow(pixels, cmap=cmap)
            drawn = ax.imshow(_scaled(maps[i]), **overlay)
            ax.set_title(f"{label}, layer {i + 1}" if row == 0 else f"rollout 1-{i + 1}")
    for ax in axes.ravel():
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0, 1].set_ylabel("this layer")
    axes[1, 1].set_ylabel("rollout")
    fig.colorbar(drawn, ax=axes[:, -1], shrink=0.8, label="attention / panel maximum")
    fig.suptitle(f"Attention to each patch ({head_fusion} over heads)")
    return save_figure(fig, path)


def plot_attention_distance(distances, path, grid_size=None, patch_size=None):
    """Scatter of mean attention distance per head against depth (the paper's Fig. 7 right).

    Args:
        distances: `(layers, heads)` from `analysis.mean_attention_distance`.
        path: PNG file to write.
        grid_size, patch_size: if given, a dashed line marks the distance of
            uniform attention over the grid, for reference.

    Example:

    >>> plot_attention_distance(np.array([[4.0, 9.0], [8.0, 12.0]]),
    ...                         "/tmp/distance.png", (4, 4), 8).name
    'distance.png'
    """
    distances = np.asarray(distances, dtype="float64")
    if distances.ndim != 2:
        raise ValueError(f"Expected distances of shape (layers, heads), got {distances.shape}.")
    depth, heads = distances.shape
    fig = Figure(figsize=(5.5, 4.2), layout="constrained")
    ax = fig.subplots()
    palette = colormaps["tab10" if heads <= 10 else "tab20"]
    colors = [palette(h % palette.N) for h in range(heads)]
    for h in range(heads):
        ax.scatter(np.arange(1, depth + 1), distances[:, h], s=22, color=colors[h],
                   label=f"head {h + 1}", edgecolors="none")
    top = distances.max()
    if grid_size is not None and patch_size is not None:
        tokens = grid_size[0] * grid_size[1]
        uniform = np.full((1, 1, tokens, tokens), 1.0 / tokens)
        level = analysis.mean_attention_distance([uniform], grid_size, patch_size)[0, 0]
        ax.axhline(level, color="grey", linestyle="--", linewidth=1, label="uniform attention")
        top = max(top, level)
    ax.set_ylim(0, 1.1 * top if top > 0 else 1)
    ax.set_xticks(np.arange(1, depth + 1))
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_title("Attended distance per head")
    ax.legend(fontsize="small", ncol=2 if heads > 8 else 1, loc="lower right")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_position_similarity(similarity, path):
    """Grid of grids of position-embedding cosine similarities (the paper's Fig. 7 centre).

    Tile `(i, j)` shows how similar the position embedding of patch `(i, j)` is
    to those of all patches.

    Args:
        similarity: `(rows, cols, rows, cols)` from
            `analysis.position_embedding_similarity`.
        path: PNG file to write.

    Example:

    >>> plot_position_similarity(np.ones((2, 3, 2, 3)), "/tmp/position.png").name
    'position.png'
    """
    similarity = np.asarray(similarity, dtype="float64")
    if similarity.ndim != 4 or similarity.shape[:2] != similarity.shape[2:]:
        raise ValueError(
            f"Expected similarities of shape (rows, cols, rows, cols), got {similarity.shape}."
        )
    rows, cols = similarity.shape[:2]
    # One image with a one-pixel NaN gap between tiles draws far faster than
    # rows * cols subplots for a 14 x 14 grid.
    mosaic = np.full((rows * (rows + 1) - 1, cols * (cols + 1) - 1), np.nan)
    for i in range(rows):
        for j in range(cols):
            mosaic[i * (rows + 1) : i * (rows + 1) + rows, j * (cols + 1) : j * (cols + 1) + cols] = (
                similarity[i, j]
            )
    side = min(8.0, 2.5 + 0.4 * max(rows, cols))
    fig = Figure(figsize=(side + 1.2, side), layout="constrained")
    ax = fig.subplots()
    cmap = colormaps["viridis"].with_extremes(bad="white")
    # The colour scale spans the data (a fixed -1 .. 1 scale washes out the
    # narrow range of e.g. a small sincos2d table); the colorbar shows it.
    drawn = ax.imshow(mosaic, cmap=cmap, vmin=similarity.min(), vmax=1, interpolation="nearest")
    ax.set_xticks(np.arange(cols) * (cols + 1) + (cols - 1) / 2, np.arange(1, cols + 1))
    ax.set_yticks(np.arange(rows) * (rows + 1) + (rows - 1) / 2, np.arange(1, rows + 1))
    ax.tick_params(length=0)
    ax.set_xlabel("Input patch column")
    ax.set_ylabel("Input patch row")
    ax.set_title("Position embedding similarity")
    fig.colorbar(drawn, ax=ax, shrink=0.8, label="Cosine similarity")
    return save_figure(fig, path)


def plot_patch_components(components, path, columns=7):
    """Principal components of the patch-embedding filters as tiles (the paper's Fig. 7 left).

    Each component is scaled to [0, 1] on its own; RGB components are drawn in
    colour, single-channel ones in grey.

    Args:
        components: `(n, P, P, channels)` from `analysis.patch_embedding_components`.
        path: PNG file to write.
        columns: tiles per row.

    Example:

    >>> plot_patch_components(np.random.rand(8, 4, 4, 3), "/tmp/filters.png").name
    'filters.png'
    """
    components = np.asarray(components, dtype="float64")
    if components.ndim != 4 or components.shape[-1] not in (1, 3):
        raise ValueError(
            f"Expected components of shape (n, P, P, 1 or 3), got {components.shape}."
        )
    count = len(components)
    grid_rows = -(-count // columns)
    fig = Figure(figsize=(1.3 * columns, 1.3 * grid_rows + 0.6), layout="constrained")
    axes = fig.subplots(grid_rows, columns, squeeze=False)
    for k, ax in enumerate(axes.ravel()):
        ax.set_axis_off()
        if k >= count:
            continue
        tile = components[k]
        low, high = tile.min(), tile.max()
        tile = (tile - low) / (high - low) if high > low else np.zeros_like(tile)
        if tile.shape[-1] == 1:
            ax.imshow(tile[..., 0], cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        else:
            ax.imshow(tile, interpolation="nearest")
        ax.set_title(f"PC {k + 1}", fontsize="small")
    fig.suptitle(f"Patch-embedding filters: first {count} principal components")
    return save_figure(fig, path)


def visualize(model, images, out_dir, head_fusion="mean"):
    """Writes the analysis figures of `model` on `images` into `out_dir`.

    `attention.png` (maps and rollout for the first image), `distance.png`
    (mean attention distance, averaged over all images), `position.png`
    (position-embedding similarity, unless the model has none) and `filters.png`
    (up to 28 principal components of the patch embedding; not for hybrids,
    whose patch embedding sees ResNet features rather than pixels).

    Args:
        model: a keras-vit ViT.
        images: `(batch, height, width, channels)` in [-1, 1].
        out_dir: directory for the PNG files (created if missing).
        head_fusion: head fusion of the attention figure.

    Returns:
        `{figure name: path}` of the files written.

    Example:

    >>> import keras_vit
    >>> model = keras_vit.ViT(image_size=32, patch_size=8, hidden_dim=32, num_layers=2,
    ...                       num_heads=4, mlp_dim=64, num_classes=10)
    >>> sorted(visualize(model, np.zeros((1, 32, 32, 3)), "/tmp/figures"))
    ['attention', 'distance', 'filters', 'position']
    """
    images = np.asarray(images, dtype="float32")
    if images.ndim != 4:
        raise ValueError(
            f"Expected images of shape (batch, height, width, channels), got {images.shape}."
        )
    out_dir = Path(out_dir)
    parts = vit_parts(model)
    grid_size, patch_size = analysis.patch_grid(model)
    # A MAP head reads the tokens through its probe's attention, not a token's row.
    map_head = isinstance(parts.pool, MAPHead)
    _, attentions, *pooling = analysis.attention_model(model, pooling=map_head)(images)
    attentions = [keras.ops.convert_to_numpy(a) for a in attentions]
    written = {
        "attention": plot_attention_maps(
            images[0], attentions, grid_size, out_dir / "attention.png", head_fusion,
            parts.num_prefix_tokens, *(keras.ops.convert_to_numpy(p) for p in pooling),
        ),
        "distance": plot_attention_distance(
            analysis.mean_attention_distance(
                attentions, grid_size, patch_size, parts.num_prefix_tokens
            ),
            out_dir / "distance.png", grid_size, patch_size,
        ),
    }
    if parts.patch_encoder.pos_embedding != "none":
        written["position"] = plot_position_similarity(
            analysis.position_embedding_similarity(model), out_dir / "position.png"
        )
    if parts.stem is None:
        kernel_shape = parts.patch_embedding.kernel.shape
        written["filters"] = plot_patch_components(
            analysis.patch_embedding_components(model, n=min(28, *kernel_shape)),
            out_dir / "filters.png",
        )
    return written


def plot_training(histories, path):
    """Test (and train) accuracy per epoch of training runs (`keras-vit demo`).

    Args:
        histories: `{name: history}` with Keras `fit` histories (`top1`, `val_top1`).
        path: the PNG file to write.

    Returns:
        The path written.

    Example:

    >>> import tempfile, os
    >>> history = dict(top1=[0.5, 0.8], val_top1=[0.6, 0.9])
    >>> plot_training({"pretrain": history}, os.path.join(tempfile.mkdtemp(), "t.png")).name
    't.png'
    """
    figure = Figure(figsize=(5, 3.6))
    axes = figure.add_subplot()
    for index, (name, history) in enumerate(histories.items()):
        for key, style, label in (("val_top1", "-", "test"), ("top1", ":", "train")):
            values = history.get(key)
            if values:
                epochs = np.arange(1, len(values) + 1)
                axes.plot(
                    epochs, 100 * np.asarray(values), style, color=f"C{index}", marker="o",
                    markersize=3, label=f"{name} ({label})",
                )
    axes.set_xlabel("epoch")
    axes.set_ylabel("accuracy (%)")
    axes.set_title("Training")
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return save_figure(figure, path, dpi=120)
