"""Few-shot results for people: a text table, and the files a run writes.

`format_table` lays out `fewshot_evaluate` results (mean ± std per shot count, one
column per run); `save_results` writes them as `fewshot.json`, `fewshot.txt` and the
plot `fewshot.png` (drawn by `keras_vit.evaluation.charts.plot_fewshot`).
"""

import json
import math
import os


def save_results(runs, out, *, references=None, title="Few-shot linear evaluation"):
    """Writes `fewshot.json`, `fewshot.txt` (the table) and `fewshot.png` under `out`.

    Args:
        runs: `{name: result}` from `fewshot_evaluate` (or a single result).
        out: the output folder (created).
        references: optional `{name: {run name: accuracy}}` rows of the table, drawn as
            dashed lines in the plot (e.g. a fine-tuned model's accuracy).
        title: the plot's title.

    Returns:
        The table (`format_table`).

    Example:

    >>> import tempfile
    >>> result = dict(shots=[1, 5], mean=[0.5, 0.75], std=[0.1, 0.05], l2=[1024.0, 1024.0])
    >>> print(save_results({"pretrained": result}, tempfile.mkdtemp()).splitlines()[0])
    shots | pretrained   | l2
    """
    if "shots" in runs:
        runs = {"accuracy": runs}
    references = references or {}
    os.makedirs(out, exist_ok=True)
    table = format_table(runs, references)
    with open(os.path.join(out, "fewshot.json"), "w") as f:
        json.dump(dict(runs=runs, references=references), f, indent=2)
    with open(os.path.join(out, "fewshot.txt"), "w") as f:
        f.write(table + "\n")
    lines = {
        f"{row} ({name})" if len(values) > 1 else row: accuracy
        for row, values in references.items()
        for name, accuracy in values.items()
    }
    from keras_vit.evaluation import charts  # matplotlib, imported only to draw

    charts.plot_fewshot(runs, os.path.join(out, "fewshot.png"), references=lines, title=title)
    return table


def format_table(runs, references=None):
    """A text table of few-shot results: one row per shot count, one column per run.

    Args:
        runs: `{name: result}` with results from `fewshot_evaluate` (or a single
            result, named "accuracy").
        references: optional `{row name: {column name: accuracy}}` extra rows, e.g.
            a fine-tuned model's accuracy.

    Example:

    >>> result = dict(shots=[1, 5], mean=[0.5, 0.75], std=[0.1, 0.05], l2=[1024.0, 1024.0])
    >>> print(format_table({"pretrained": result}))
    shots | pretrained   | l2
    ------+--------------+-----
        1 | 50.0 ± 10.0% | 2^10
        5 | 75.0 ± 5.0%  | 2^10
    """
    if "shots" in runs:
        runs = {"accuracy": runs}
    references = references or {}
    names = list(runs)
    shots = sorted({s for result in runs.values() for s in result["shots"]})
    show_l2 = len(runs) == 1
    header = ["shots", *names] + (["l2"] if show_l2 else [])
    rows = []
    for count in shots:
        row = [str(count)]
        for result in runs.values():
            if count in result["shots"]:
                i = result["shots"].index(count)
                row.append(f"{100 * result['mean'][i]:.1f} ± {100 * result['std'][i]:.1f}%")
            else:
                row.append("-")
        if show_l2:
            (result,) = runs.values()
            row.append(f"2^{math.log2(result['l2'][result['shots'].index(count)]):g}")
        rows.append(row)
    for label, values in references.items():
        row = [label] + [
            f"{100 * values[name]:.1f}%" if name in values else "-" for name in names
        ]
        rows.append(row + ([""] if show_l2 else []))
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]

    def line(cells):
        text = [cells[0].rjust(widths[0])] + [c.ljust(w) for c, w in zip(cells[1:], widths[1:])]
        return " | ".join(text).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *map(line, rows)])
