"""Packaging beyond pyproject.toml: the repository's top-level `recipes/` ship in the wheel
as `keras_vit/recipes/` (`keras_vit.cli.shipped_recipes` finds them in either place);
pyproject.toml's `packages.find` cannot add a package that lives in another folder."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["keras_vit", "keras_vit.*"]) + ["keras_vit.recipes"],
    package_dir={"keras_vit.recipes": "recipes"},
)
