"""The paper's pipeline in miniature: pretrain, few-shot evaluate, fine-tune (`keras-vit demo`).

On scikit-learn's digits (built in, no network): a small ViT is pretrained on some
classes (0-4), its frozen representation is scored by few-shot linear evaluation on the
other classes (5-9) against the same architecture with random weights, and it is then
fine-tuned on those classes at a higher resolution (the position embedding resampled,
the head replaced by a zero-initialised one, as in the paper). `recipes/demo.py` holds
the hyperparameters; the stages are `keras_vit.train` and `keras_vit.evaluation.fewshot`. TensorFlow
backend only (the training engine's tf.data and tf.distribute).

Output folder:

```
OUT/pretrain/               the pretraining run (see keras_vit.runs), plus encoder.npz
OUT/finetune/               the fine-tuning run
OUT/fewshot.json|txt|png    few-shot results, pretrained and random init
OUT/training.png            test accuracy per epoch of both runs
OUT/summary.json, OUT/table.txt
OUT/digit.png               a test digit (a 3, 8x8 grey) to try `visualize` and `predict` on
```
"""

import dataclasses
import io
import json
import logging
import os
import tempfile
import time

import numpy as np

from keras_vit.evaluation import fewshot
from keras_vit.weights.pretrained import save_npz
from keras_vit.evaluation.fewshot import FewshotConfig
from keras_vit.training.config import TrainConfig
from keras_vit.training.engine import train
from keras_vit.utils.files import atomic_write

logger = logging.getLogger("keras_vit")

ENCODER = "encoder.npz"
SAMPLE_DIGIT = "digit.png"


def write_sample_digit(path):
    """Writes the first 3 of the digits' test split as an 8x8 grey PNG: an image file the
    docs' `keras-vit visualize` and `predict` examples read.

    Example:

    >>> import tempfile, keras
    >>> from keras_vit.digits import digits_arrays
    >>> path = os.path.join(tempfile.mkdtemp(), "digit.png")
    >>> write_sample_digit(path)
    >>> pixels = keras.utils.img_to_array(keras.utils.load_img(path, color_mode="grayscale"))
    >>> images, labels = digits_arrays("test")
    >>> bool((pixels == images[labels == 3][0]).all())
    True
    """
    import keras

    from keras_vit.digits import digits_arrays

    images, labels = digits_arrays("test")
    keras.utils.save_img(path, images[np.flatnonzero(labels == 3)[0]], scale=False)


@dataclasses.dataclass
class DemoConfig:
    """The three stages of the demo: each a config of its own engine.

    `pretrain` and `finetune` are `TrainConfig`s (their `data.classes` select the two
    halves of the data; `finetune.model.init_from` is set to the pretrained encoder), `fewshot` a
    `FewshotConfig` evaluated on the pretrained model and on a randomly initialised copy.
    `out` is the output folder; each run goes in a sub-folder.

    Example:

    >>> from keras_vit.cli import load_recipe
    >>> config = load_recipe("demo", attribute="DEMO")
    >>> config.pretrain.data.classes, config.fewshot.classes, config.finetune.data.classes
    ('0-4', '5-9', '5-9')
    """

    pretrain: TrainConfig
    fewshot: FewshotConfig
    finetune: TrainConfig
    out: str = "runs/demo"

    def validate(self):
        """Validates the three stage configs; returns self."""
        self.pretrain.validate()
        self.fewshot.validate()
        self.finetune.validate()
        return self


def save_encoder(model, path):
    """Saves `model`'s weights as an official `.npz` without its head.

    Fine-tuning from it replaces the head by a zero-initialised one, as the paper does,
    even when the new task has as many classes as the old one.

    Example:

    >>> import tempfile, keras_vit
    >>> vit = keras_vit.ViT(image_size=8, patch_size=4, hidden_dim=16, num_layers=1,
    ...                     num_heads=2, mlp_dim=32, num_classes=5, channels=1)
    >>> path = os.path.join(tempfile.mkdtemp(), "encoder.npz")
    >>> save_encoder(vit, path)
    >>> sorted(k for k in np.load(path) if k.startswith("head"))
    []
    """
    with tempfile.TemporaryDirectory(prefix="keras_vit_encoder_") as folder:
        full = os.path.join(folder, "model.npz")
        save_npz(model, full)
        with np.load(full) as params:
            encoder = {key: params[key] for key in params.files if not key.startswith("head/")}
    buffer = io.BytesIO()
    np.savez(buffer, **encoder)
    atomic_write(os.fspath(path), buffer.getvalue())


def _accuracy(result):
    return result.metrics.get("top1", float("nan"))


def _stage_name(config):
    return f"classes {config.data.classes or 'all'}, {config.model.image_size} px"


def _train_stage(title, config, seconds, verbose):
    """Runs one training stage with log lines before and after; records its seconds."""
    stage = os.path.basename(config.out)
    logger.info(
        "%s on %s (%s), %d epochs -> %s",
        title, config.data.source, _stage_name(config), config.schedule.epochs, config.out,
    )
    start = time.time()
    result = train(config, verbose=verbose)
    seconds[stage] = time.time() - start
    logger.info("%s: test accuracy %.4f (%.0f s)", stage, _accuracy(result), seconds[stage])
    return result


def run_demo(config, *, out=None, verbose="auto"):
    """Runs the demo: pretrain, few-shot evaluate (pretrained and random init), fine-tune.

    Args:
        config: a `DemoConfig` (`recipes/demo.py`'s `DEMO`).
        out: the output folder (default `config.out`).
        verbose: Keras' progress display (`"auto"`: bars on a terminal, a line per
            epoch otherwise); every stage logs to the `keras_vit` logger.

    Returns:
        The summary dict also written to `OUT/summary.json`: `pretrain_accuracy`,
        `fewshot` (`{"pretrained": result, "random init": result}`),
        `finetune_accuracy`, `table`, `seconds` per stage.

    Example (what `keras-vit demo` runs; skipped under pytest: it trains for minutes,
    and tests/test_cli.py runs a shortened demo):

    >>> from keras_vit.cli import load_recipe
    >>> summary = run_demo(load_recipe("demo", attribute="DEMO"), out="runs/demo")  # doctest: +SKIP
    >>> print(summary["table"])  # doctest: +SKIP
    shots | pretrained ...
    """
    config.validate()
    out = out or config.out
    os.makedirs(out, exist_ok=True)
    seconds = {}

    pretrain_config = config.pretrain.replace(out=os.path.join(out, "pretrain"))
    pretrained = _train_stage("Stage 1/3: pretraining", pretrain_config, seconds, verbose)

    start = time.time()
    logger.info(
        "Stage 2/3: few-shot linear evaluation on classes %s, shots %s, %d seeds: "
        "the pretrained encoder, then the same architecture with random weights",
        config.fewshot.classes or "all", ",".join(map(str, config.fewshot.shots)),
        config.fewshot.seeds,
    )
    # The same architecture with fresh initialisers, rebuilt from its config (a
    # VisionTransformer; keras.models.clone_model would return a plain Functional).
    random_init = type(pretrained.model).from_config(pretrained.model.get_config())
    results = {
        "pretrained": fewshot.evaluate_source(pretrained.model, config.fewshot),
        "random init": fewshot.evaluate_source(random_init, config.fewshot),
    }
    seconds["fewshot"] = time.time() - start
    for name, result in results.items():
        scores = ", ".join(
            f"{shots}-shot {100 * mean:.1f}%" for shots, mean in zip(result["shots"], result["mean"])
        )
        logger.info("Few-shot, %s: %s", name, scores)

    encoder = os.path.join(pretrain_config.out, ENCODER)
    save_encoder(pretrained.model, encoder)
    finetune_config = config.finetune.replace(
        out=os.path.join(out, "finetune"), model=dict(init_from=encoder)
    )
    finetuned = _train_stage(
        "Stage 3/3: fine-tuning the pretrained encoder", finetune_config, seconds, verbose
    )

    references = {
        f"pretrain ({_stage_name(pretrain_config)})": {"pretrained": _accuracy(pretrained)},
        f"fine-tune ({_stage_name(finetune_config)})": {"pretrained": _accuracy(finetuned)},
    }
    table = fewshot.save_results(
        results, out, references=references,
        title=f"Few-shot on classes {config.fewshot.classes or 'all'}",
    )
    from keras_vit import figures  # matplotlib, imported only to draw

    figures.plot_training(
        {"pretrain": pretrained.history, "fine-tune": finetuned.history},
        os.path.join(out, "training.png"),
    )
    summary = dict(
        pretrain_accuracy=_accuracy(pretrained),
        fewshot=results,
        finetune_accuracy=_accuracy(finetuned),
        table=table,
        seconds=seconds,
    )
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(table + "\n")
    write_sample_digit(os.path.join(out, SAMPLE_DIGIT))
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
    return summary
