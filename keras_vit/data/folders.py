"""Image folders at scale: listing, a cheap check of every file, and a listing cache.

Start-up reads the folder tree and a few bytes of each file, never decodes it: a file is
kept when it starts like a JPEG, PNG, GIF or BMP file and a JPEG or PNG also ends like
one (its end-of-image marker or `IEND` chunk, which a truncated download lacks). The
result is cached under the folder's path and the modification times of its class
folders (which change when a file is added, removed or renamed), so a resume or another
worker on the host reads one small file instead of the tree.
"""

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
from typing import Optional

import tensorflow as tf

logger = logging.getLogger("keras_vit")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# How files of the decoders' formats begin; `decode_image` reads all four.
MAGIC = {
    b"\xff\xd8\xff": "jpeg",
    b"\x89PNG\r\n\x1a\n": "png",
    b"GIF87a": "gif",
    b"GIF89a": "gif",
    b"BM": "bmp",
}
# How complete JPEG and PNG files end, looked for in their last TAIL bytes (some
# writers pad after the marker).
END_MARKERS = {"jpeg": b"\xff\xd9", "png": b"IEND"}
TAIL = 1024
# Files checked at once: the check waits on storage, not on the CPU.
CHECK_THREADS = 32
CHECK_CHUNK = 64
CACHE_VERSION = 1


def cache_folder():
    """Where listings are cached: `$KERAS_VIT_CACHE`, else `~/.cache/keras_vit`."""
    return os.environ.get("KERAS_VIT_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "keras_vit"
    )


@dataclasses.dataclass
class Listing:
    """A class folder tree, listed and checked.

    Attributes:
        classes: class folder names, sorted (labels are their indices).
        paths: image files kept, in class then name order.
        labels: the label of each kept file.
        damaged: `{path: reason}` of image files left out by the check.
        ignored: `{kind: count}` of what is not an image of a class: hidden entries,
            nested folders, loose files and other file types (by extension).
        cached: whether this listing was read from the cache.
    """

    classes: list
    paths: list
    labels: list
    damaged: dict
    ignored: dict
    cached: bool = False

    def ignored_line(self, folder):
        """One line saying what was ignored in `folder`, or None."""
        if not self.ignored:
            return None
        parts = ", ".join(f"{count} {kind}" for kind, count in sorted(self.ignored.items()))
        return f"Ignored in {folder}: {parts} (classes are the sub-folders; images are " \
            f"{'/'.join(IMAGE_EXTENSIONS)} files directly inside them)."


def is_remote(path):
    return "://" in path


def scan(folder):
    """`(sub-folder names, file names)` of `folder` (local: no stat per file)."""
    if not is_remote(folder):
        folders, files = [], []
        with os.scandir(folder) as entries:
            for entry in entries:
                (folders if entry.is_dir() else files).append(entry.name)
        return folders, files
    folders, files = [], []
    for name in tf.io.gfile.listdir(folder):
        if name.endswith("/"):
            folders.append(name.rstrip("/"))
        elif tf.io.gfile.isdir(os.path.join(folder, name)):
            folders.append(name)
        else:
            files.append(name)
    return folders, files


def damage(path):
    """Why `path` is not a readable image ("empty", "truncated", ...), or None."""
    try:
        if is_remote(path):
            with tf.io.gfile.GFile(path, "rb") as f:
                head = f.read(16)
                size = f.seek(0, 2)
                f.seek(max(size - TAIL, 0))
                tail = f.read()
        else:  # Two positioned reads, no buffering: a fraction of the syscalls of open().
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                head = os.pread(fd, 16, 0)
                tail = os.pread(fd, TAIL, max(size - TAIL, 0))
            finally:
                os.close(fd)
    except (OSError, tf.errors.OpError) as error:
        return f"unreadable ({error.__class__.__name__})"
    if not head:
        return "empty"
    kind = next((kind for magic, kind in MAGIC.items() if head.startswith(magic)), None)
    if kind is None:
        return "not a JPEG, PNG, GIF or BMP file"
    marker = END_MARKERS.get(kind)
    if marker and marker not in tail:
        return f"truncated {kind.upper()} (no end marker)"
    return None


def find_damaged(paths):
    """`{path: reason}` for the files of `paths` that `damage` finds, checked in parallel.

    Example:

    >>> find_damaged([])
    {}
    """
    # Threads hide storage latency; chunks keep the pool's own cost per file small.
    chunks = [paths[i:i + CHECK_CHUNK] for i in range(0, len(paths), CHECK_CHUNK)]
    with concurrent.futures.ThreadPoolExecutor(CHECK_THREADS) as pool:
        reasons = pool.map(lambda chunk: [damage(path) for path in chunk], chunks)
        return {
            path: reason
            for chunk, chunk_reasons in zip(chunks, reasons)
            for path, reason in zip(chunk, chunk_reasons)
            if reason
        }


def list_folder(folder):
    """Lists and checks the class folder tree at `folder` (no cache; see `load_listing`)."""
    folders, files = scan(folder)
    ignored = {}

    def ignore(kind, count=1):
        ignored[kind] = ignored.get(kind, 0) + count

    classes = sorted(name for name in folders if not name.startswith("."))
    ignore_counts = {
        "hidden entries": sum(name.startswith(".") for name in folders + files),
        "loose files beside the class folders": sum(not name.startswith(".") for name in files),
    }
    paths, labels = [], []
    for label, name in enumerate(classes):
        class_folder = os.path.join(folder, name)
        sub_folders, names = scan(class_folder)
        ignore_counts["hidden entries"] += sum(n.startswith(".") for n in sub_folders + names)
        ignore("nested folders", sum(not n.startswith(".") for n in sub_folders))
        for file in sorted(n for n in names if not n.startswith(".")):
            extension = os.path.splitext(file)[1].lower()
            if extension in IMAGE_EXTENSIONS:
                paths.append(os.path.join(class_folder, file))
                labels.append(label)
            else:
                ignore(f"{extension or 'extension-less'} files")
    for kind, count in ignore_counts.items():
        ignore(kind, count)
    ignored = {kind: count for kind, count in ignored.items() if count}
    damaged = find_damaged(paths)
    if damaged:
        kept = [i for i, path in enumerate(paths) if path not in damaged]
        paths, labels = [paths[i] for i in kept], [labels[i] for i in kept]
    return Listing(classes, paths, labels, damaged, ignored)


def folder_key(folder):
    """What the listing of `folder` depends on: its path and its class folders' mtimes,
    or None where modification times cannot be read (then nothing is cached)."""
    if is_remote(folder):
        return None
    root = os.path.abspath(folder)
    try:
        with os.scandir(root) as entries:
            stamps = sorted(
                (entry.name, entry.stat().st_mtime_ns) for entry in entries if entry.is_dir()
            )
        text = json.dumps(
            dict(version=CACHE_VERSION, folder=folder, root=root,
                 mtime=os.stat(root).st_mtime_ns, folders=stamps)
        )
    except OSError:
        return None
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def load_listing(folder, cache_dir: Optional[str] = None):
    """`list_folder(folder)`, read from the listing cache when the folder is unchanged.

    A cached listing's damaged files are checked again (a file fixed in place keeps its
    folder's modification time). Writing the cache is best effort: an unwritable cache
    folder only costs the next start-up a new listing.
    """
    key = folder_key(folder)
    path = key and os.path.join(cache_dir or cache_folder(), "listings", f"{key}.json")
    if path and os.path.exists(path):
        try:
            with open(path) as f:
                listing = Listing(**json.load(f), cached=True)
        except (OSError, ValueError, TypeError):
            listing = None
        if listing is not None and find_damaged(list(listing.damaged)) == listing.damaged:
            return listing
    listing = list_folder(folder)
    if path:
        saved = dataclasses.asdict(listing)
        del saved["cached"]
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.{os.getpid()}.tmp"
            with open(partial, "w") as f:
                json.dump(saved, f)
            os.replace(partial, path)
        except OSError as error:
            logger.info("Listing of %s not cached (%s).", folder, error)
    return listing
