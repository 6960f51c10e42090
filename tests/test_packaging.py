"""The distribution: what the built wheel holds, the extras that pyproject.toml declares,
and the one line a missing optional package is reported in."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import ROOT, clean_environment, tiny_vit

from keras_vit import cli
from keras_vit.utils import extras

def test_the_installed_wheel_runs_the_shipped_recipes_from_any_folder(installed, tmp_path):
    script = (
        "import keras_vit, keras_vit.cli as cli\n"
        "print(keras_vit.__file__)\n"
        "print(cli.find_recipe('demo'))\n"
        "print(cli.load_recipe('demo', attribute='DEMO').fewshot.classes)\n"
    )
    result = subprocess.run(
        [str(installed / "python"), "-c", script], cwd=tmp_path, capture_output=True,
        text=True, env=clean_environment(HOME=str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr
    module, recipe, classes = result.stdout.split()
    site = installed.parent / "lib"
    assert Path(module).is_relative_to(site), module  # the wheel's copy, not this checkout
    assert Path(recipe) == Path(module).parent / "recipes" / "demo.py"
    assert classes == "5-9"
    assert (installed / "keras-vit").is_file()


def test_the_wheel_holds_every_package_and_recipe(installed):
    site, = (installed.parent / "lib").glob("python*/site-packages")
    shipped = {p.name for p in (site / "keras_vit" / "recipes").glob("*.py")}
    assert shipped >= {p.name for p in (ROOT / "recipes").glob("*.py")}
    packages = {p.parent.relative_to(ROOT) for p in (ROOT / "keras_vit").rglob("__init__.py")}
    assert all((site / p / "__init__.py").is_file() for p in packages)
    assert (site / "keras_vit" / "weights" / "labels" / "imagenet1k.txt").is_file()


def test_every_optional_module_is_installed_by_the_extra_it_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == extras.DISTRIBUTION
    declared = project["optional-dependencies"]

    def normalized(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    for module, extra in extras.EXTRAS.items():
        names = {normalized(re.match(r"[A-Za-z0-9_.-]+", r).group()) for r in declared[extra]}
        assert normalized(module) in names, (module, extra)
    # The test extra installs every other one.
    (self_reference,) = [r for r in declared["test"] if r.startswith(extras.DISTRIBUTION)]
    assert set(re.search(r"\[(.*)\]", self_reference).group(1).split(",")) == (
        set(declared) - {"test"}
    )


def test_a_missing_exporter_is_one_line_naming_the_extra(tmp_path, monkeypatch, capsys):
    model = tiny_vit()
    model.save(tmp_path / "model.keras")
    # None in sys.modules is how Python reports a package that is not installed.
    monkeypatch.setitem(sys.modules, "onnx", None)
    code = cli.main(["export", "--from", str(tmp_path / "model.keras"), "--format", "onnx",
                     "--out", str(tmp_path / "vit.onnx")])
    assert code == 2
    assert capsys.readouterr().err == (
        "keras-vit export: error: ONNX export needs onnx, which is not installed: "
        'pip install "keras3-vit[export]".\n'
    )


def test_a_backend_that_is_not_installed_is_one_line_naming_the_extra(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['jax'] = None\n"
        "from keras_vit.cli import main\n"
        "sys.exit(main(['weights']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True,
        env=clean_environment(KERAS_BACKEND="jax", PYTHONPATH=str(ROOT)),
    )
    assert result.returncode == 2
    assert result.stderr == (
        "keras-vit weights: error: KERAS_BACKEND=jax needs jax, which is not installed: "
        'pip install "keras3-vit[jax]".\n'
    )


def test_a_keras_cv_augmentation_without_keras_cv_names_the_extra(monkeypatch):
    from keras_vit.data.augment import as_layer

    monkeypatch.setitem(sys.modules, "keras_cv", None)
    with pytest.raises(ImportError) as raised:
        as_layer(dict(module="keras_cv.layers", class_name="GridMask", config={}))
    assert str(raised.value) == (
        "The augmentation 'GridMask' needs keras_cv, which is not installed: "
        'pip install "keras3-vit[keras-cv]".'
    )


def test_a_recipe_in_the_current_folder_runs_only_when_named_as_a_path(tmp_path, monkeypatch):
    # A folder someone else prepared: its recipes/fewshot.py would write a file if run.
    hostile = tmp_path / "recipes" / "fewshot.py"
    hostile.parent.mkdir()
    marker = tmp_path / "executed"
    hostile.write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from keras_vit.evaluation.fewshot import FewshotConfig\n"
        "CONFIG = FewshotConfig(data='digits', shots=(1,), seeds=1)\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli.find_recipe("fewshot") == cli.shipped_recipes() / "fewshot.py"
    assert cli.load_recipe("fewshot").shots == (1, 5, 10, 25)
    assert not marker.exists()
    assert cli.load_recipe("./recipes/fewshot.py").shots == (1,)
    assert marker.exists()
