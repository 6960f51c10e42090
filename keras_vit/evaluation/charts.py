"""Charts of evaluation results (matplotlib): few-shot accuracy against shots, and the
robustness probes.

The evaluation writes them with its numbers (`fewshot_report.save_results`,
`probes.save_results`); `keras_vit.figures`, above evaluation, draws every figure of a
model and names these too. Charts are drawn with matplotlib's object-oriented API on the
Agg canvas: importing this module neither needs a display nor changes pyplot's backend.
"""

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def save_figure(fig, path, dpi=None):
    """Writes the matplotlib `fig` to `path` (its folder created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi or fig.dpi)
    return path


def plot_probes(results, path):
    """Accuracy under patch occlusion and patch shuffling (`probes.robustness_probes`).

    Example:

    >>> results = {"accuracy": 0.9, "occlusion": {0.0: 0.9, 0.5: 0.6},
    ...            "shuffle": {1: 0.9, 2: 0.7}, "examples": 100}
    >>> plot_probes(results, "/tmp/probes.png").name
    'probes.png'
    """
    occlusion = sorted((float(f), a) for f, a in results["occlusion"].items())
    shuffle = sorted((int(g), a) for g, a in results["shuffle"].items())
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    clean = dict(color="grey", linestyle="--", linewidth=1,
                 label=f"clean accuracy {100 * results['accuracy']:.1f}%")
    if occlusion:
        left.plot([100 * f for f, _ in occlusion], [100 * a for _, a in occlusion], "o-")
    left.set_xlabel("Patches dropped (%)")
    left.set_title("Random patch occlusion")
    if shuffle:
        positions = np.arange(len(shuffle))
        right.plot(positions, [100 * a for _, a in shuffle], "o-", color="tab:orange")
        right.set_xticks(positions, [f"{g}x{g}" for g, _ in shuffle])
    right.set_xlabel("Shuffle grid (cells per side)")
    right.set_title("Random patch shuffling")
    for ax in (left, right):
        ax.axhline(100 * results["accuracy"], **clean)
        ax.set_ylabel("Top-1 accuracy (%)")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower left")
    fig.suptitle(f"Robustness probes ({results['examples']} examples)")
    return save_figure(fig, path)


def plot_fewshot(runs, path, *, references=None, title="Few-shot linear evaluation"):
    """Accuracy (mean ± std over seeds) against shots per class (`fewshot_evaluate`).

    Args:
        runs: `{name: result}` from `fewshot_evaluate` (or a single result).
        path: the PNG file to write.
        references: optional `{name: accuracy}` drawn as horizontal dashed lines.
        title: the figure title.

    Returns:
        The path written.

    Example:

    >>> import tempfile, os
    >>> result = dict(shots=[1, 5], mean=[0.5, 0.75], std=[0.1, 0.05])
    >>> plot_fewshot({"pretrained": result}, os.path.join(tempfile.mkdtemp(), "fewshot.png")).name
    'fewshot.png'
    """
    if "shots" in runs:
        runs = {"accuracy": runs}
    figure = Figure(figsize=(5, 3.6))
    axes = figure.add_subplot()
    all_shots = sorted({s for result in runs.values() for s in result["shots"]})
    for name, result in runs.items():
        axes.errorbar(
            result["shots"], 100 * np.asarray(result["mean"]), yerr=100 * np.asarray(result["std"]),
            marker="o", capsize=3, label=name,
        )
    for index, (name, accuracy) in enumerate((references or {}).items()):
        axes.axhline(100 * accuracy, linestyle="--", color=f"C{len(runs) + index}", label=name)
    axes.set_xscale("log")
    axes.set_xticks(all_shots)
    axes.set_xticklabels([str(s) for s in all_shots])
    axes.minorticks_off()
    axes.set_xlabel("shots per class")
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    return save_figure(figure, path, dpi=120)
