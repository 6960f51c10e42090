"""The user's path as installed: the shell commands of the docs (README.md, then the
site's pages in the order of mkdocs.yml's nav: `conftest.doc_pages`), in that order, run
against the built wheel in a fresh venv outside the checkout, with an empty HOME and no
KERAS_VIT_* setting but KERAS_VIT_WEIGHTS_MIRROR (a loopback server holding checkpoints
written by `save_npz` at the registry paths of the docs' two pretrained models).

`PLAN` says, for every command of the docs' ```bash blocks (by its first line), how it
runs: verbatim (None), as an equivalent (`Instead`, with why), or not at all (`Skip`,
with why). A command that appeared word for word earlier in the reading order runs
once. `test_every_docs_command_has_a_plan` (quick) fails when the docs gain, lose or
change a command; `test_the_docs_as_a_user_types_them` (slow) runs the plan. Where the
docs show a command's output in a comment (`#   NAME.png, ...` after it), the files it
names must be in the command's `--out` folder; where they show what it prints (`SHOWN`),
the test compares it with what the demo run printed before it.
"""

import collections
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import build_wheel, clean_environment, doc_pages, install_wheel

Command = collections.namedtuple("Command", "line text outputs")
Instead = collections.namedtuple("Instead", "command why")
Skip = collections.namedtuple("Skip", "why")

# The pretrained models the docs download (about 330 and 37 MiB): the mirror holds models
# of the same shapes, with random weights, under the same registry paths.
PRETRAINED = "vit_base_patch16_384.augreg_recommended_in21k_ft_in1k"
TO_FINETUNE = "vit_tiny_patch16_224.augreg_recommended_in21k"
NETWORK = "needs the network (the test has only the loopback mirror)"
SUITE = "runs the test suite, of which this test is part"
CLUSTER = "needs machines the test does not have (several hosts, a TPU, Docker)"
IMAGENET = "needs ImageNet (or its archives) and days of accelerator time"
TWO = ("one shell block, run as written by tests/test_jax_processes.py (on a free port, "
       "through this checkout)")

PLAN = {
    "pip install -e . && keras-vit demo": Instead(
        "keras-vit demo", "the built wheel is what this test installs (in the venv, with "
        "--no-deps: no network); `pip install -e .` would install the checkout"),
    'pip install -e ".[test]" && python -m pytest -n 2 --dist loadfile': Skip(SUITE),
    'pip install -e ".[jax]"       # then: KERAS_BACKEND=jax keras-vit ...': Instead(
        "KERAS_BACKEND=jax keras-vit weights", "installing " + NETWORK + "; the venv sees "
        "the environment's jax, so the command the comment names runs"),
    'pip install -e ".[torch]"     # torch 2.13.0 from PyPI (which build: docs/getting-started.md)': Skip(
        "installing " + NETWORK + "; the venv sees the environment's torch"),
    'pip install -e ".[torch]"     # torch 2.13.0 from PyPI (which build: below)': Skip(
        "installing " + NETWORK + "; the venv sees the environment's torch (the next "
        "command uses it)"),
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu  # CPU only, Linux": Skip(
        "installing " + NETWORK),
    'pip install -e ".[torch]"': Skip("installing " + NETWORK),
    "KERAS_BACKEND=torch keras-vit weights": None,
    # docs/native-resolution.md and docs/training.md: commands on the user's own files.
    "keras-vit predict --from naflex.keras photos/                        # the model's budget": Skip(
        "names the user's NaFlex model and photos; tests/test_naflex_serving.py runs "
        "`keras-vit predict` (a subprocess) on a NaFlex model's .keras file and a folder of "
        "mixed-size photos"),
    "keras-vit predict --from naflex.keras photos/ --max-num-patches 40   # more detail": Skip(
        "names the user's files; tests/test_naflex_serving.py runs it with --max-num-patches 40"),
    "keras-vit predict --from model.keras photos/ --naflex                # a fixed-grid model": Skip(
        "names the user's files; tests/test_naflex_serving.py runs --naflex on a fixed-grid "
        ".keras model"),
    "keras-vit export --from naflex.keras --out models/naflex/1": Skip(
        "names the user's NaFlex model; tests/test_naflex_serving.py exports one and serves it "
        "at two token counts"),
    "keras-vit export --from naflex.keras --format onnx --out naflex.onnx": Skip(
        "names the user's NaFlex model; tests/test_naflex_serving.py exports one to ONNX and "
        "runs it in onnxruntime"),
    "keras-vit finetune --recipe demo --from runs/digits --data ./my_images \\": Skip(
        "needs the user's image folder; tests/test_naflex_training.py runs this NaFlex "
        "fine-tune from a digits run on digits drawn at six sizes"),
    'pip install -e ".[export]"    # ONNX and LiteRT exporters and runtimes': Skip(
        "installing " + NETWORK),
    'pip install -e ".[hf]"        # hf:ORG/NAME and timm:NAME weights (huggingface_hub)': Skip(
        "installing " + NETWORK),
    'pip install -e ".[keras-cv]"  # keras-cv\'s augmentation layers': Skip(
        "installing " + NETWORK),
    "python -c '": None,  # the docs' first python -c: keras_vit.pretrained(PRETRAINED)
    f"keras-vit predict --weights {PRETRAINED} cat.jpg": None,
    "keras-vit weights augreg_recommended   # the checkpoints by name (or B/16, 'vit_base_*in1k', ...)": None,
    f"keras-vit finetune --from {TO_FINETUNE} --data photos/ \\": None,
    "keras-vit predict --from runs/photos cat.jpg   # your classes, as the folders name them": None,
    "keras-vit export --from runs/photos --out models/photos/1   # TensorFlow SavedModel": None,
    "keras-vit export --from runs/photos --format onnx --out photos.onnx": None,
    "keras-vit predict --from runs/demo/pretrain runs/demo/digit.png  # top 5 of digits 0-4": None,
    "keras-vit visualize --from runs/demo/pretrain --image runs/demo/digit.png --out figures/": None,
    "keras-vit probe --from runs/demo/pretrain --out probes/": None,
    "keras-vit weights augreg_recommended   # or B/16, 'vit_base_*in1k', ...": None,
    "cat > finetune_augreg.py <<'PY'": None,
    "python finetune_augreg.py": Skip(
        "downloads CIFAR-10 and fine-tunes B/16 at 384 px for 10k steps of 512 images"),
    "keras-vit fewshot --from runs/demo/pretrain --data digits --classes 5-9 --l2 sweep --out runs/fewshot": None,
    "keras-vit export --from runs/demo/finetune --out models/vit/1 --top-k 3": None,
    'docker run -p 8501:8501 -v "$PWD/models/vit:/models/vit" -e MODEL_NAME=vit tensorflow/serving': Skip(CLUSTER),
    'curl -d "{\\"signature_name\\": \\"serving_bytes\\", \\"instances\\": [{\\"b64\\": '
    '\\"$(base64 -w0 cat.jpg)\\"}]}" \\': Skip("asks the TensorFlow Serving container above"),
    "keras-vit finetune --recipe demo --from runs/demo/pretrain --out runs/demo_lora --set model.lora_rank=4": None,
    "keras-vit pretrain --recipe mpp --data tfds:imagenet2012  # the paper's: B/16, Adam 2e-4, 1M steps": Skip(IMAGENET),
    "keras-vit pretrain --recipe demo_mpp                       # digits, about a minute on a CPU": None,
    "keras-vit finetune --recipe demo_mpp --from runs/demo_mpp --out runs/demo_mpp_tuned \\": None,
    "keras-vit fewshot --from runs/demo_mpp --data digits --out runs/fewshot_mpp": None,
    "keras-vit pretrain|finetune [--recipe NAME] [--data SOURCE] [--out DIR] [--from CKPT]": Skip(
        "a synopsis; the commands after it are its forms"),
    "keras-vit pretrain --recipe demo --set schedule.epochs=5 --set model.kwargs.num_layers=3": None,
    "keras-vit finetune --from vit_base_patch16_224.orig_in21k --data tfds:cifar10 \\": Skip(
        "downloads CIFAR-10 and fine-tunes B/16"),
    "keras-vit finetune --recipe demo --from runs/digits --out runs/digits32 --set model.image_size=32  # new resolution": None,
    'keras-vit pretrain --recipe pretrain --data "tfds:imagenet2012:train[:99%]" \\': Skip(IMAGENET),
    'tfds build imagenet2012 --data_dir "$TFDS_DATA_DIR" --file_format array_record': Skip(IMAGENET),
    "mkdir -p imagenet21k && tar -xzf winter21_whole.tar.gz -C imagenet21k && cd imagenet21k": Skip(IMAGENET),
    "for t in $(find . -name 'n*.tar'); do c=$(basename \"$t\" .tar)": Skip(IMAGENET),
    "keras-vit pretrain --recipe pretrain --data imagenet21k  # train/ and val/ are its splits": Skip(IMAGENET),
    "TF_CONFIG='{\"cluster\": {\"worker\": [\"host1:12345\", \"host2:12345\"]}, \"task\": "
    "{\"type\": \"worker\", \"index\": 0}}' \\": Skip(CLUSTER),
    "srun --nodes=2 --ntasks-per-node=1 keras-vit pretrain --recipe pretrain --strategy multiworker "
    "--out /shared/runs/b16": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm create vit --zone=us-central2-b --accelerator-type=v4-8 "
    "--version=tpu-vm-tf-2.16.1-pjrt": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm scp --recurse . vit:keras-vit --zone=us-central2-b  # this checkout": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm ssh vit --zone=us-central2-b": Skip(CLUSTER),
    "pip install -e ./keras-vit  # on the VM": Skip(CLUSTER),
    "keras-vit pretrain --recipe pretrain --strategy tpu --data tfds:imagenet2012 \\": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm create vit-pod --zone=us-central2-b --accelerator-type=v4-32 "
    "--version=tpu-vm-tf-2.16.1-pod-pjrt": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm scp --recurse . vit-pod:keras-vit --zone=us-central2-b --worker=all": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm ssh vit-pod --zone=us-central2-b --worker=all --command='pip install "
    "-e ./keras-vit'": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm ssh vit-pod --zone=us-central2-b --worker=all --command='TPU_NAME=vit-pod \\": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm ssh vit-pod --zone=us-central2-b --worker=all --command='KERAS_BACKEND=jax \\": Skip(CLUSTER),
    "gcloud compute tpus tpu-vm ssh vit-pod --zone=us-central2-b --worker=all --command='pip install -e "
    '"./keras-vit[jax]" "jax[tpu]"\'': Skip(CLUSTER),
    "srun --nodes=2 --ntasks-per-node=8 --gpus-per-task=1 env KERAS_BACKEND=jax \\": Skip(CLUSTER),
    # The two-process block, one shell: tests/test_jax_processes.py runs it as written.
    "export KERAS_BACKEND=jax JAX_COORDINATOR_ADDRESS=127.0.0.1:8476 JAX_NUM_PROCESSES=2": Skip(TWO),
    "JAX_PROCESS_ID=1 keras-vit pretrain --recipe demo --out runs/two --set schedule.epochs=2 &": Skip(TWO),
    "JAX_PROCESS_ID=0 keras-vit pretrain --recipe demo --out runs/two --set schedule.epochs=2": Skip(TWO),
    "wait": Skip(TWO),
    'python -m pytest -m "not slow"': Skip(SUITE),
}
# Commands that appear more than once by first line but differ after it run each time.
SECOND_PYTHON_C = {  # the docs' later `python -c` blocks, in order
    1: Skip("reads gs:// (Google Cloud Storage): " + NETWORK),
    2: Skip("downloads from the Hugging Face Hub: " + NETWORK),
    3: Skip("downloads timm's SigLIP and CLIP files from the Hugging Face Hub: " + NETWORK),
}


def _incomplete(text):
    """Whether a shell command goes on at the next line."""
    if text.rstrip().endswith("\\") or re.match(r"for\b", text) and not text.rstrip().endswith("done"):
        return True
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote: `python -c '` ... `'`
        return True
    return False


def readme_commands(text):
    """The commands of a page's ```bash blocks, in order, with the output files the
    comment right after a command names (`#   attention.png, ...`)."""
    commands = []
    for block in re.finditer(r"```bash\n(.*?)```", text, flags=re.S):
        lines = block.group(1).splitlines()
        i, after_command = 0, False
        while i < len(lines):
            line = lines[i]
            i += 1
            if line.startswith("#"):
                if after_command and line.startswith("#   "):
                    commands[-1].outputs.extend(re.findall(r"[\w-]+\.(?:png|json)", line))
                else:
                    after_command = False
                continue
            if not line.strip():
                after_command = False
                continue
            body = [line]
            heredoc = re.search(r"<<'?(\w+)'?", line)
            while i < len(lines) and (
                (heredoc and body[-1] != heredoc.group(1))
                or (not heredoc and (_incomplete("\n".join(body)) or lines[i].startswith(" ")))
            ):
                body.append(lines[i])
                i += 1
            commands.append(Command(line, "\n".join(body), []))
            after_command = True
    return commands


def docs_commands():
    """Every page's commands, in reading order."""
    return [command for _, text in doc_pages() for command in readme_commands(text)]


def plan(commands):
    """`(command, how)` for each docs command, `how` from `PLAN` (a command met word for
    word before: skipped, it ran then)."""
    python_c, seen = 0, set()
    for command in commands:
        how = PLAN[command.line]
        if command.line == "python -c '":
            how = SECOND_PYTHON_C.get(python_c, how)
            python_c += 1
        if command.text in seen:
            how = Skip("the same command ran earlier in the reading order")
        seen.add(command.text)
        yield command, how


def test_every_docs_command_has_a_plan():
    commands = docs_commands()
    assert {c.line for c in commands} == set(PLAN)
    assert sum(c.line == "python -c '" for c in commands) == 1 + len(SECOND_PYTHON_C)
    assert [c.outputs for c in commands if c.outputs] == [
        ["attention.png", "distance.png", "position.png", "filters.png"],
        ["probes.png", "probes.json"],
    ]
    assert set(SHOWN) <= {c.line for c in commands}


def _shown_fewshot(printed, work):
    """`keras-vit fewshot ... --l2 sweep` prints the demo's pretrained column (the docs
    show it beside the demo's table): the same rows, the same mean ± std."""
    demo = (work / "runs" / "demo" / "table.txt").read_text()
    column = [line.split("|")[1].strip() for line in demo.splitlines()
              if re.match(r"\s*\d+ \|", line)]
    printed = [line.split("|")[1].strip() for line in printed.splitlines()
               if re.match(r"\s*\d+ \|", line)]
    return printed == column or f"printed {printed}, the demo {column}"


def _shown_probe(printed, work):
    """`keras-vit probe` on the demo's pretraining run scores the 180 test digits 0-4 (as
    the docs show), so its clean accuracy is the demo's pretraining accuracy."""
    import json

    summary = json.loads((work / "runs" / "demo" / "summary.json").read_text())
    line = f"digits, 5 classes: 180 images, clean accuracy {summary['pretrain_accuracy']:.4f}"
    return line in printed or f"printed no {line!r}: {printed[:300]!r}"


# What the docs show a command printing, checked against this run's own demo (the
# figures themselves differ across CPUs: docs/getting-started.md says why).
SHOWN = {
    "keras-vit fewshot --from runs/demo/pretrain --data digits --classes 5-9 --l2 sweep --out runs/fewshot": _shown_fewshot,
    "keras-vit probe --from runs/demo/pretrain --out probes/": _shown_probe,
}


def _user_files(folder):
    """What the docs assume the user has: a photo (cat.jpg) and a folder of photos, one
    sub-folder per class (photos/cat/, photos/dog/)."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    tf.io.write_file(str(folder / "cat.jpg"), tf.io.encode_jpeg(photo))
    for label, tint in (("cat", 0), ("dog", 2)):
        (folder / "photos" / label).mkdir(parents=True)
        for index in range(12):  # three of the docs command's batches of 8
            image = rng.integers(0, 128, (240, 320, 3), dtype=np.uint8)
            image[..., tint] += 120
            tf.io.write_file(str(folder / "photos" / label / f"{index}.jpg"), tf.io.encode_jpeg(image))


def _out_folder(text):
    match = re.search(r"--out\s+(\S+)", text)
    return match and match.group(1)


@pytest.mark.slow
def test_the_docs_as_a_user_types_them(bucket, tmp_path):
    import keras_vit
    from keras_vit.weights import registry

    # The mirror: each model (random weights, head included) at its registry path.
    entries = [registry.get_weights(name) for name in (PRETRAINED, TO_FINETUNE)]
    for entry in entries:
        model = keras_vit.ViT(entry.variant, image_size=entry.image_size,
                              num_classes=entry.num_classes, **entry.model_args)
        head = model.parts.head
        head.kernel.assign(np.random.default_rng(0).normal(0, 0.02, head.kernel.shape))
        bucket.put(entry.relative_path, model)
        del model

    bin_dir = install_wheel(build_wheel(tmp_path / "dist"), tmp_path / "venv")
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    _user_files(work)
    env = clean_environment(
        HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        KERAS_VIT_WEIGHTS_MIRROR=os.environ["KERAS_VIT_WEIGHTS_MIRROR"],
    )
    # TF_CPP_MIN_LOG_LEVEL and OMP_NUM_THREADS: tests/conftest.py sets them for the suite.
    for name in ("KERAS_BACKEND", "KERAS_HOME", "TF_CPP_MIN_LOG_LEVEL", "OMP_NUM_THREADS",
                 "VIRTUAL_ENV"):
        env.pop(name, None)

    # The venv's python runs the wheel's copy of keras_vit, not this checkout's (nor an
    # editable install's): the venv's site-packages come before the environment's.
    where = subprocess.run(
        ["python", "-c", "import keras_vit; print(keras_vit.__file__)"], cwd=work, env=env,
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(tmp_path / "venv"), where

    failures, ran = [], []
    for command, how in plan(docs_commands()):
        if isinstance(how, Skip):
            continue
        text = how.command if isinstance(how, Instead) else command.text
        started = time.monotonic()
        result = subprocess.run(["bash", "-c", text], cwd=work, env=env, capture_output=True,
                                text=True, timeout=1800)
        ran.append(f"{time.monotonic() - started:6.1f} s  {text.splitlines()[0]}")
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or [result.stdout[-300:]])[-1]
            failures.append(f"{text.splitlines()[0]!r} exited {result.returncode}: {last[:300]}")
            continue
        for name in command.outputs:
            if not (work / _out_folder(text) / name).is_file():
                failures.append(f"{text.splitlines()[0]!r} wrote no {name}")
        if command.line in SHOWN:
            verdict = SHOWN[command.line](result.stdout, work)
            if verdict is not True:
                failures.append(f"{text.splitlines()[0]!r} printed what the docs do not show: {verdict}")
    print("\nran:\n  " + "\n  ".join(ran))
    # The docs' downloads came from the mirror, once each, into the default cache.
    assert sorted(bucket.requests) == sorted("/" + entry.relative_path for entry in entries)
    for entry in entries:
        assert (home / ".keras" / "models" / "keras_vit" / entry.relative_path).is_file()
    assert not failures, "\n".join(failures)


def test_shown_outputs_are_compared_with_the_demos(tmp_path):
    """The checks of `SHOWN` accept what the demo's own figures make, and name a mismatch."""
    import json

    demo = tmp_path / "runs" / "demo"
    demo.mkdir(parents=True)
    (demo / "table.txt").write_text(
        "shots | pretrained  | random init\n------+-------------+------------\n"
        "    1 | 33.1 ± 4.1% | 25.7 ± 4.5%\n    5 | 48.9 ± 3.3% | 40.2 ± 5.3%\n"
        "  pretrain (classes 0-4, 8 px) | 94.4%       | -\n")
    (demo / "summary.json").write_text(json.dumps({"pretrain_accuracy": 0.94444}))
    fewshot = "shots | pretrain    | l2\n------+----\n    1 | 33.1 ± 4.1% | 2^6\n    5 | 48.9 ± 3.3% | 2^2\n"
    assert _shown_fewshot(fewshot, tmp_path) is True
    assert "48.7" in _shown_fewshot(fewshot.replace("48.9", "48.7"), tmp_path)
    probe = "digits, 5 classes: 180 images, clean accuracy 0.9444\n"
    assert _shown_probe(probe, tmp_path) is True
    assert _shown_probe(probe.replace("5 classes: 180", "10 classes: 360"), tmp_path) is not True
