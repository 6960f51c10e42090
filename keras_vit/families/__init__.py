"""The checkpoint families keras-vit builds, one module each: `FAMILIES` collects them.

Every module of this package but `family` (the types they fill in) is a family and
defines `FAMILY`, a `keras_vit.families.family.Family`; they are found by listing the
package, so a new family is one new module. The paper's ViT comes first (its names are
the ones every family's files share), then the others by name. `keras_vit.weights`
reads `FAMILIES` for the registry's entries, the HF configs and the checkpoint names.
"""

import importlib
import pkgutil


def _family_modules():
    """The package's family modules, imported: `vit`, then the others by name."""
    names = sorted((module.name for module in pkgutil.iter_modules(__path__)
                    if module.name != "family"), key=lambda name: (name != "vit", name))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


FAMILIES = tuple(module.FAMILY for module in _family_modules())
