"""Commands write only where they may: a folder or file is replaced only when it is the
command's own kind of output (an earlier export, a keras-vit run), never the folder an
export comes from, and the temporaries of killed writes are cleared by the next write to
the same target (issue 48, items 1-3). Each test runs the commands as a user does, with
an empty HOME."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras_vit
from keras_vit import cli
from keras_vit.training import runs

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--set", "model.kwargs.hidden_dim=16", "--set", "model.kwargs.num_layers=1",
    "--set", "model.kwargs.num_heads=2", "--set", "model.kwargs.mlp_dim=32",
    "--set", "schedule.epochs=1", "--set", "schedule.micro_batches_per_epoch=2",
    "--set", "schedule.warmup_updates=0", "--set", "data.batch_size=4",
    "--set", "distribution.jit_compile=off",
]


def tree(folder):
    """Every file under `folder` with its bytes: what must survive a refused command."""
    return {
        os.path.relpath(os.path.join(root, name), folder): Path(root, name).read_bytes()
        for root, _, names in os.walk(folder) for name in names
    }


def user_files(folder):
    """A folder of the user's own files (a thesis, photos)."""
    (folder / "photos").mkdir(parents=True)
    (folder / "thesis.tex").write_text("\\chapter{Results}")
    (folder / "photos" / "beach.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a model")
    return tree(folder)


@pytest.fixture(autouse=True)
def empty_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder as `keras-vit pretrain` writes it (a tiny model, two steps)."""
    root = tmp_path_factory.mktemp("trained")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(root / "home"))
        patch.chdir(root)
        out = root / "run"
        assert cli.main(["pretrain", "--recipe", "demo", "--out", str(out), *TINY]) == 0
    return out


@pytest.fixture
def run(trained, tmp_path):
    """A copy of the run, for a command that might destroy it."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def export(capsys, *argv):
    """`keras-vit export ARGV`: its exit code and its stderr."""
    code = cli.main(["export", *map(str, argv)])
    return code, capsys.readouterr().err


# --- 1. an export never replaces the folder it exports from --------------------------


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
@pytest.mark.parametrize("how", ["same", "dot-dot", "link", "above", "model file"])
def test_export_never_replaces_the_run_folder_it_exports_from(run, tmp_path, capsys, how,
                                                              overwrite):
    before = tree(run)
    os.symlink(run, tmp_path / "link")
    source, out = {
        "same": (run, run),
        "dot-dot": (run, run / "checkpoints" / ".."),
        "link": (run, tmp_path / "link"),
        "above": (run, tmp_path),
        "model file": (run / runs.MODEL, run),
    }[how]
    code, err = export(capsys, "--from", source, "--out", out, *overwrite)
    assert code == 2
    assert err.startswith("keras-vit export: error: ") and err.count("\n") == 1, err
    assert f"--out {out}" in err and "holds what it exports" in err, err
    assert tree(run) == before


def test_an_onnx_export_never_replaces_the_model_file_it_exports(run, capsys):
    pytest.importorskip("onnx")
    before = tree(run)
    code, err = export(capsys, "--from", run / runs.MODEL, "--out", run / runs.MODEL,
                       "--format", "onnx", "--overwrite")
    assert code == 2 and "holds what it exports" in err, err
    assert tree(run) == before


# --- 2. an export replaces only an earlier export (or anything, with --overwrite) ----


def test_export_into_a_folder_of_the_users_files_is_refused_unless_overwrite(run, tmp_path,
                                                                               capsys):
    folder = tmp_path / "Documents"
    before = user_files(folder)
    code, err = export(capsys, "--from", run, "--out", folder)
    assert code == 2 and err.count("\n") == 1, err
    assert f"--out {folder} holds files that are not a keras-vit export" in err, err
    assert "thesis.tex" in err and "--overwrite" in err
    assert tree(folder) == before
    # `--overwrite` asks for it: the folder becomes the export.
    assert export(capsys, "--from", run, "--out", folder, "--overwrite")[0] == 0
    assert sorted(os.listdir(folder)) == sorted(
        ["assets", "assets.extra", "fingerprint.pb", "saved_model.pb", "variables"]
    )


def test_the_refusal_comes_before_the_model_loads(run, tmp_path, capsys):
    folder = tmp_path / "Documents"
    user_files(folder)
    (run / runs.MODEL).write_bytes(b"damaged")  # the refusal must not depend on it
    code, err = export(capsys, "--from", run, "--out", folder)
    assert code == 2 and "not a keras-vit export" in err, err


def test_an_earlier_export_is_replaced_and_its_copy_with_the_users_notes_is_not(run, tmp_path,
                                                                                  capsys):
    out = tmp_path / "served"
    assert export(capsys, "--from", run, "--out", out)[0] == 0
    first = (out / "saved_model.pb").stat().st_ino
    assert export(capsys, "--from", run, "--out", out, "--top-k", "2")[0] == 0
    assert (out / "saved_model.pb").stat().st_ino != first  # replaced, as before
    (out / "notes.txt").write_text("what I changed")
    code, err = export(capsys, "--from", run, "--out", out)
    assert code == 2 and "notes.txt" in err, err
    assert (out / "notes.txt").read_text() == "what I changed"
    # An empty folder holds nothing to lose.
    (tmp_path / "empty").mkdir()
    assert export(capsys, "--from", run, "--out", tmp_path / "empty")[0] == 0


@pytest.mark.parametrize("format", ["onnx", "tflite"])
def test_a_file_export_replaces_only_an_earlier_export(run, tmp_path, capsys, format):
    pytest.importorskip("onnx")
    thesis = tmp_path / f"thesis.{format}"
    thesis.write_text("\\chapter{Results}")
    code, err = export(capsys, "--from", run, "--out", thesis, "--format", format)
    assert code == 2 and "is not a keras-vit export" in err and "--overwrite" in err, err
    assert thesis.read_text() == "\\chapter{Results}"
    out = tmp_path / f"model.{format}"
    assert export(capsys, "--from", run, "--out", out, "--format", format)[0] == 0
    assert export(capsys, "--from", run, "--out", out, "--format", format)[0] == 0
    # A folder of the user's is not a file to replace, even with --overwrite.
    before = user_files(tmp_path / "Documents")
    code, err = export(capsys, "--from", run, "--out", tmp_path / "Documents", "--format",
                       format, "--overwrite")
    assert code == 2 and "is a folder" in err, err
    assert tree(tmp_path / "Documents") == before


def test_restart_clears_only_a_keras_vit_run(tmp_path, capsys, monkeypatch):
    """`pretrain --restart` deletes a run's files by name; a folder of the user's that
    holds such names (their own checkpoints/, logs/, config.json) is no run to clear."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "project"
    user_files(folder)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "resnet_epoch9.pt").write_bytes(b"weeks of training")
    (folder / "logs").mkdir()
    (folder / "logs" / "events.out").write_bytes(b"my curves")
    (folder / "config.json").write_text('{"model_type": "resnet", "depths": [3, 4, 6, 3]}')
    before = tree(folder)
    for restart in (["--restart"], []):  # without it, the run would write over config.json
        code = cli.main(["pretrain", "--recipe", "demo", "--out", str(folder), *restart, *TINY])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"{folder} is not a keras-vit run" in err and "config.json" in err, err
        assert tree(folder) == before


# --- 3. the temporaries of killed writes are cleared by the next write ----------------


def temporaries(folder):
    return sorted(name for name in os.listdir(folder) if name.startswith(".tmp-"))


def killed(argv, pattern, cwd):
    """Runs `argv` (a `python` command line) killed while it writes a file matching
    `pattern` (the hook of `keras_vit.utils.files`)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_VIT_TEST_KILL_AT": f"{pattern}:1",
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([sys.executable, *argv], env=env, cwd=cwd, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]


def test_the_next_export_clears_what_killed_exports_left(run, tmp_path, capsys):
    out = tmp_path / "served"
    for _ in range(2):
        killed(["-m", "keras_vit", "export", "--from", str(run), "--out", str(out)],
               "served", tmp_path)
    left = temporaries(tmp_path)  # the second kill's (the second export cleared the first's)
    assert len(left) == 1 and left[0].endswith("-served"), left
    other = tmp_path / ".tmp-abcd1234-served2"  # another target's: not this write's to clear
    other.mkdir()
    assert export(capsys, "--from", run, "--out", out)[0] == 0
    assert temporaries(tmp_path) == [other.name]
    assert (out / "saved_model.pb").is_file()


SAVE_NPZ = """
import sys
import keras_vit
model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1, num_heads=2,
                      mlp_dim=32, num_classes=4)
keras_vit.save_npz(model, sys.argv[1])
"""


def test_save_npz_clears_what_killed_saves_left(tmp_path):
    target = tmp_path / "vit.npz"
    for _ in range(3):
        killed(["-c", SAVE_NPZ, str(target)], "vit.npz", tmp_path)
    assert len(temporaries(tmp_path)) == 1 and not target.exists()
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                          num_heads=2, mlp_dim=32, num_classes=4)
    keras_vit.save_npz(model, target)
    assert temporaries(tmp_path) == []
    with np.load(target) as saved:
        assert "cls" in saved.files


WRITER = """
import sys
from keras_vit.utils.files import atomic_path
with atomic_path(sys.argv[1]) as temporary:
    print(temporary, flush=True)
    sys.stdin.readline()
    open(temporary, "w").write("the other writer's")
"""


def test_a_write_never_clears_the_temporary_of_a_live_writer(tmp_path):
    target = tmp_path / "vit.npz"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    live = writer.stdout.readline().strip()
    assert os.path.basename(live).startswith(".tmp-")
    model = keras_vit.ViT(image_size=16, patch_size=8, hidden_dim=16, num_layers=1,
                          num_heads=2, mlp_dim=32, num_classes=4)
    keras_vit.save_npz(model, target)
    assert os.path.exists(live)
    writer.communicate("go\n", timeout=60)
    assert writer.returncode == 0
    assert target.read_text() == "the other writer's" and temporaries(tmp_path) == []
