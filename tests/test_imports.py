"""Imports point one way (ARCHITECTURE.md): the layers of [tool.importlinter] in
pyproject.toml, no cycle in any package, and test modules that import no other test
module; and `import keras_vit` leaves a process as a library import does.

import-linter reads every import statement, those inside functions too, without running
the code. Each rule has a negative control: the same check on a copy of the sources with
one forbidden import added fails and names it.
"""

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

TESTS = ROOT / "tests"
# The one test module whose subject is bench/ (its scripts' own functions).
TESTS_OF_BENCH = {"test_bench.py"}


def lint_imports(root):
    """Runs import-linter on the `keras_vit` under `root` with the contracts of
    `root/pyproject.toml`; returns (exit code, report)."""
    script = (
        "import sys\n"
        "from importlinter.cli import lint_imports\n"
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(root)}, timeout=300,
    )
    return result.returncode, result.stdout + result.stderr


def test_imports_keep_the_layers_and_form_no_cycle():
    code, report = lint_imports(ROOT)
    assert code == 0, report
    assert "Contracts: 2 kept, 0 broken." in report


def copy_of_the_package(folder):
    """`keras_vit/` and pyproject.toml copied into `folder`: sources to break."""
    shutil.copytree(ROOT / "keras_vit", folder / "keras_vit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", folder / "pyproject.toml")
    return folder


def add_import(path, statement):
    """Appends a function holding `statement` to the module at `path`: an import that
    runs only when called, which the check must still see."""
    with open(path, "a") as f:
        f.write(f"\n\ndef _added():\n    {statement}\n")


def test_negative_control_an_upward_import_inside_a_function_is_named(tmp_path):
    root = copy_of_the_package(tmp_path)
    add_import(root / "keras_vit" / "models" / "variants.py",
               "from keras_vit.training import config")
    code, report = lint_imports(root)
    assert code == 1
    assert "keras_vit.models is not allowed to import keras_vit.training" in report
    assert "keras_vit.models.variants -> keras_vit.training.config" in report


def test_negative_control_a_cycle_within_a_package_is_named(tmp_path):
    # model_files imports errors; errors importing model_files back closes a cycle.
    root = copy_of_the_package(tmp_path)
    add_import(root / "keras_vit" / "utils" / "errors.py",
               "from keras_vit.utils import model_files")
    code, report = lint_imports(root)
    assert code == 1
    assert "No cycles are allowed in keras_vit.utils." in report


def test_negative_control_a_package_in_no_layer_is_named(tmp_path):
    root = copy_of_the_package(tmp_path)
    (root / "keras_vit" / "unplaced.py").write_text('"""In no layer of the contract."""\n')
    code, report = lint_imports(root)
    assert code == 1
    assert "keras_vit.unplaced" in report


def imported_modules(source):
    """The top-level names of every module that `source` imports, at any depth."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def forbidden_imports(path):
    """What the tests' file `path` imports that it must not: a test module (`test_*`),
    conftest (pytest's, never imported), the tests folder as a package, or bench/
    (unless the file tests bench/)."""
    names = imported_modules(path.read_text())
    bad = {n for n in names if n.startswith("test_") or n in ("conftest", "tests")}
    if path.name not in TESTS_OF_BENCH:
        bad |= names & {"bench"}
    return sorted(bad)


def test_no_test_module_imports_another_or_bench():
    """Shared test code lives in helper modules (helpers.py, family_contract.py,
    references.py) and conftest.py's fixtures."""
    found = {p.name: forbidden_imports(p) for p in sorted(TESTS.glob("*.py"))}
    assert {name: bad for name, bad in found.items() if bad} == {}


def test_negative_control_imports_of_test_modules_and_bench_are_found(tmp_path):
    path = tmp_path / "test_example.py"
    path.write_text(
        "import os\nfrom helpers import tiny_vit\nimport test_model\n\n"
        "def test_x():\n"
        "    from tests.conftest import ROOT\n"
        "    from bench.contenders import KerasViT\n"
    )
    assert forbidden_imports(path) == ["bench", "test_model", "tests"]


# What a process holds after importing keras and keras_vit, as JSON: what the import hook
# of `import keras_vit` (Keras not yet imported) may leave behind.
PROCESS_STATE = """
import json, logging, sys, warnings
import numpy as np
finders = [type(f).__name__ for f in sys.meta_path]
for name in sys.argv[1:]:
    __import__(name)
import keras
print(json.dumps(dict(
    finders_added=sorted(set(type(f).__name__ for f in sys.meta_path) - set(finders)),
    keras_vit_modules=sorted(m for m in sys.modules if m.startswith("keras_vit")),
    registered=sorted(k for k in keras.saving.get_custom_objects() if k.startswith("keras_vit>")),
    config=[keras.config.floatx(), keras.config.dtype_policy().name,
            keras.config.image_data_format(), keras.config.epsilon()],
    warning_filters=len(warnings.filters), numpy_errors=np.geterr(),
    loggers={name: [logger.level, len(logger.handlers)]
             for name, logger in logging.root.manager.loggerDict.items()
             if isinstance(logger, logging.Logger) and (logger.level or logger.handlers)},
)))
"""


def process_state(*imports):
    result = subprocess.run(
        [sys.executable, "-c", PROCESS_STATE, *imports], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow  # two fresh processes import Keras and its backend
def test_keras_imported_after_keras_vit_leaves_what_the_other_order_leaves():
    """`import keras_vit` before Keras installs a one-shot import hook that registers the
    layers once Keras is imported: it removes itself, and the process then holds the
    modules, registrations and global settings that `import keras; import keras_vit`
    gives, nothing more."""
    hooked = process_state("keras_vit")  # then keras
    eager = process_state("keras", "keras_vit")
    assert hooked["finders_added"] == eager["finders_added"]
    assert "_LoadAfterKeras" not in hooked["finders_added"]
    assert hooked == eager
    assert "keras_vit>VisionTransformer" in hooked["registered"]
