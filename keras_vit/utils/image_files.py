"""Image files by name, without TensorFlow: the extensions keras-vit reads, and files,
folders and glob patterns expanded to image paths (`image_paths`), which the command line
checks before Keras starts."""

import glob
import os

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
GLOB_CHARACTERS = "*?["


def image_paths(specs):
    """The image files that `specs` name, in order: a file is itself, a folder gives every
    image file below it (by extension, hidden entries left out, sorted), a glob pattern
    (`*`, `?`, `[...]`, `**` for any depth) its matches, sorted. A folder named as an
    image file (`x.jpg/`) is kept as a path, not walked: reading it fails, naming it.

    Args:
        specs: a path or pattern, or a list of them.

    Returns:
        A list of paths (duplicates removed, first occurrence kept).

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for name in ("b.png", "a.JPG", "notes.txt", ".hidden.png"):
    ...     open(os.path.join(folder, name), "w").close()
    >>> [os.path.basename(p) for p in image_paths(folder)]
    ['a.JPG', 'b.png']
    >>> [os.path.basename(p) for p in image_paths(os.path.join(folder, "*.png"))]
    ['b.png']
    """
    specs = [specs] if isinstance(specs, (str, os.PathLike)) else list(specs)
    paths = []
    for spec in map(os.fspath, specs):
        if os.path.isdir(spec) and not _image_name(spec):
            found = []
            for folder, folders, names in os.walk(spec, followlinks=False):
                if _hidden(folder, spec):
                    continue
                # A folder named as an image file is not walked: it is named as a file
                # that cannot be read, as it would be given alone.
                files = [name for name in folders if _image_name(name)]
                folders[:] = [name for name in folders if not _image_name(name)]
                found.extend(os.path.join(folder, name) for name in files + names
                             if _image_name(name))
            if not found:
                raise FileNotFoundError(
                    f"Folder {spec!r} holds no image files ({'/'.join(IMAGE_EXTENSIONS)})."
                )
            paths.extend(sorted(found))
        elif any(c in spec for c in GLOB_CHARACTERS) and not os.path.exists(spec):
            found = sorted(p for p in glob.glob(spec, recursive=True)
                           if os.path.isfile(p) or _image_name(p))
            if not found:
                raise FileNotFoundError(f"No file matches {spec!r}.")
            paths.extend(found)
        else:
            paths.append(spec)
    return list(dict.fromkeys(paths))


def _image_name(path):
    """Whether `path` is named as an image file (by extension, not hidden)."""
    name = os.path.basename(os.path.normpath(path))
    return not name.startswith(".") and name.lower().endswith(IMAGE_EXTENSIONS)


def _hidden(folder, root):
    relative = os.path.relpath(folder, root)
    return relative != "." and any(part.startswith(".") for part in relative.split(os.sep))
