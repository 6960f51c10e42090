"""Fetching checkpoint files: a verified download into a cache, and `hf:` / `timm:` sources.

Files are downloaded with `keras.utils.get_file` (progress bar on stderr) into
`$KERAS_VIT_CACHE`, by default `<Keras cache>/models/keras_vit` (`~/.keras` or
`$KERAS_HOME`), at the path the file has under `https://storage.googleapis.com/vit_models/`
(e.g. `augreg/B_16-....npz`). A file found there is used without any network request.
A download goes to a temporary name and is moved into place only once it is verified:
against the SHA-256 when the registry knows it, otherwise by reading the whole archive
(every `.npz` member's CRC; a `.safetensors` header against the file length), so an
interrupted, truncated or corrupt download is never kept. A cached file is verified again
on its first use after its size or modification time changed (a record beside it,
`.NAME.verified`, keeps what was verified). A plain `http://` download is refused unless
the registry has the file's SHA-256 (or the server is on the loopback interface).
`KERAS_VIT_WEIGHTS_MIRROR=BASE_URL` replaces the official prefix, for mirrors and
air-gapped sites. `hf:ORG/NAME` and `timm:NAME` go through `huggingface_hub` (and its
own cache), the optional extra `pip install "keras3-vit[hf]"`.
"""

import contextlib
import hashlib
import ipaddress
import json
import os
import sys
import tempfile
import urllib.parse
import zipfile

from keras_vit.utils.extras import optional_import
from keras_vit.utils.files import atomic_path, atomic_write
from keras_vit.weights import registry

MIRROR_ENV = "KERAS_VIT_WEIGHTS_MIRROR"
CACHE_ENV = "KERAS_VIT_CACHE"


class DownloadError(FileNotFoundError):
    """A checkpoint is not in the cache and could not be downloaded (or failed its check)."""


def cache_dir():
    """Where downloaded checkpoints are kept: `$KERAS_VIT_CACHE`, else
    `models/keras_vit` under Keras' own folder (`$KERAS_HOME`, else `~/.keras`).

    Keras' folder is found the way Keras documents it rather than through a Keras
    function: `keras.config` has no public name for it that every 3.x release keeps.
    """
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    keras_home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(keras_home, "models", "keras_vit")


def download_url(url):
    """`url` with `https://storage.googleapis.com/vit_models/` replaced by
    `$KERAS_VIT_WEIGHTS_MIRROR` when that is set.

    Example:

    >>> download_url("https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz")
    'https://storage.googleapis.com/vit_models/imagenet21k/ViT-B_16.npz'
    """
    mirror = os.environ.get(MIRROR_ENV)
    if mirror and url.startswith(registry.OFFICIAL_BASE):
        return mirror.rstrip("/") + "/" + url[len(registry.OFFICIAL_BASE):]
    return url


def cache_path(url):
    """The file a download of `url` is kept as (whether or not it is there yet)."""
    if url.startswith(registry.OFFICIAL_BASE):
        relative = url[len(registry.OFFICIAL_BASE):]
    else:  # other URLs: one folder per URL, keeping the file name
        digest = hashlib.sha256(url.encode()).hexdigest()[:16]
        relative = f"urls/{digest}/{url.rsplit('/', 1)[-1].split('?')[0] or 'weights'}"
    return os.path.join(cache_dir(), *relative.split("/"))


def cached(entry):
    """The cached file of a registry entry, or None when it is not downloaded."""
    path = cache_path(entry.url)
    return path if os.path.isfile(path) else None


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify(path, sha256=None, size=None):
    """Raises `ValueError` unless the file at `path` is complete; returns its SHA-256.

    With `sha256` (and `size`, in bytes), they decide; otherwise an `.npz` (zip) archive is
    read in full (every member's CRC) and a `.safetensors` file's header must account for
    its length.
    """
    if size is not None and os.path.getsize(path) != size:
        raise ValueError(f"it holds {os.path.getsize(path)} bytes, the registry says {size}")
    digest = _sha256(path)
    if sha256 is not None:
        if digest != sha256.lower():
            raise ValueError(f"its SHA-256 is {digest}, the registry says {sha256}")
        return digest
    check_complete(path)
    return digest


def check_complete(path):
    """Raises `ValueError` unless `path` is a whole `.npz` archive or `.safetensors` file."""
    with open(path, "rb") as f:
        magic = f.read(8)
    if magic[:4] == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise ValueError(f"it is not a complete .npz archive ({err})") from None
        if bad is not None:
            raise ValueError(f"its member {bad!r} fails the CRC check")
        return
    if len(magic) == 8:  # safetensors: u64 header length, JSON header, tensor data
        length = int.from_bytes(magic, "little")
        size = os.path.getsize(path)
        if 8 + length <= size:
            with open(path, "rb") as f:
                f.seek(8)
                try:
                    header = json.loads(f.read(length))
                except ValueError:
                    header = None
            if isinstance(header, dict):
                end = max(
                    (t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"),
                    default=0,
                )
                if 8 + length + end == size:
                    return
                raise ValueError(f"it holds {size} bytes, its header describes {8 + length + end}")
    raise ValueError("it is neither a complete .npz archive nor a .safetensors file")


def fetch(url, *, sha256=None, size=None):
    """The local path of `url`'s file, downloaded into the cache once and verified.

    A file already in the cache is verified again (as a download is) on its first use
    after its size or modification time changed since it was last verified, which a
    small record beside it (`.NAME.verified`) keeps.

    Args:
        url: an `https://` (or `http://`) URL; official URLs go to the mirror when
            `KERAS_VIT_WEIGHTS_MIRROR` is set.
        sha256: the file's expected SHA-256, or None to verify by reading it in full.
        size: the file's expected size in bytes, or None.

    Returns:
        The cached file's path. Nothing is downloaded when it is already there.

    Raises:
        DownloadError: one line naming the URL (or the cached file) and what to do:
            the cache path where a copy downloaded by other means is picked up, or
            that a cached file failing its check is to be deleted.
    """
    final = cache_path(url)
    if os.path.isfile(final):
        if verified(final, sha256) is None:
            try:
                remember_verified(final, verify(final, sha256, size))
            except ValueError as err:
                raise DownloadError(
                    f"The cached file {final} fails its check: {err}; delete it to download "
                    "it again."
                ) from None
        return final
    folder = os.path.dirname(final)
    try:
        os.makedirs(folder, exist_ok=True)
        # Tried before downloading: a download the cache cannot keep would be wasted.
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:  # read-only, not a folder, no permission, full
        raise DownloadError(
            f"The weights cache {cache_dir()} cannot be written ({err.strerror}: "
            f"{err.filename or folder}); set {CACHE_ENV} to a writable folder."
        ) from None
    origin = download_url(url)
    check_transport(origin, sha256)
    where = f"a copy placed at {final} is used without downloading"
    import keras  # here: listing and finding cached files (keras-vit weights) runs without Keras

    with atomic_path(final) as partial:
        try:
            # The progress bar goes to stderr, as pip's and huggingface_hub's do: stdout
            # stays the command's output (e.g. predict --json).
            with contextlib.redirect_stdout(sys.stderr):
                keras.utils.get_file(
                    fname=os.path.basename(partial), origin=origin,
                    cache_dir=os.path.dirname(partial), cache_subdir="", force_download=True,
                )
        except Exception as err:
            # get_file re-raises urllib's errors as "URL fetch failure on ..."; their
            # reason (refused, HTTP 404, retrieval incomplete) is what the user needs.
            cause = err.__context__ if hasattr(err.__context__, "reason") else err
            reason = getattr(cause, "reason", cause)
            if getattr(cause, "code", None) is not None:
                reason = f"HTTP {cause.code} {reason}"
            reason = " ".join(str(reason).split()) or type(err).__name__
            raise DownloadError(f"Cannot download {origin} ({reason}); {where}.") from None
        try:
            digest = verify(partial, sha256, size)
        except ValueError as err:
            raise DownloadError(
                f"The download of {origin} is incomplete or corrupt and was not kept: {err}; "
                f"{where}."
            ) from None
    remember_verified(final, digest)
    return final


def check_transport(origin, sha256):
    """Raises `DownloadError` for a plain `http://` download with no SHA-256 to check.

    Anything on the way can replace such a file with another valid checkpoint; a
    loopback address (a mirror on this machine) is exempt, as nothing is on its way.

    Example:

    >>> check_transport("http://127.0.0.1:8000/ViT-B_16.npz", None)
    >>> check_transport("http://mirror.example/ViT-B_16.npz", "ab" * 32)
    """
    parts = urllib.parse.urlsplit(origin)
    if parts.scheme != "http" or sha256 is not None:
        return
    host = parts.hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise DownloadError(
            f"Refusing to download {origin} over plain http:// with no SHA-256 to check it "
            "against (the registry has none for it): use an https:// mirror, or register "
            "the entry with its sha256."
        )


def _record(path):
    folder, name = os.path.split(path)
    return os.path.join(folder, f".{name}.verified")


def verified(path, sha256=None):
    """The SHA-256 `path` had when last verified, or None when it was never verified,
    changed since (size or modification time) or does not have `sha256`."""
    try:
        with open(_record(path)) as f:
            record = json.load(f)
        stat = os.stat(path)
        unchanged = (record["size"], record["mtime_ns"]) == (stat.st_size, stat.st_mtime_ns)
        digest = record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not unchanged or (sha256 is not None and digest != sha256.lower()):
        return None
    return digest


def remember_verified(path, digest):
    """Records that `path`, as it is now, was verified and has SHA-256 `digest`.

    Best effort: in a read-only cache the file is verified again at each use.
    """
    stat = os.stat(path)
    record = dict(size=stat.st_size, mtime_ns=stat.st_mtime_ns, sha256=digest)
    try:
        atomic_write(_record(path), json.dumps(record))
    except OSError:
        pass


def fetch_hub(source):
    """`hf:ORG/NAME` (an HF transformers model folder) or `timm:NAME` (timm's
    `model.safetensors` in `timm/NAME`), downloaded by `huggingface_hub` into its cache."""
    kind, _, repo = source.partition(":")
    hub = optional_import("huggingface_hub", "Loading hf: or timm: weights")
    try:
        if kind == "timm":
            repo = repo if "/" in repo else f"timm/{repo}"
            return hub.hf_hub_download(repo, "model.safetensors")
        return hub.snapshot_download(repo, allow_patterns=["*.safetensors", "*.json"])
    except Exception as err:  # the hub's errors: offline, unknown repository, ...
        reason = " ".join(str(err).split())[:300]
        raise DownloadError(f"Cannot get {source} from the Hugging Face Hub ({reason}).") from None


def resolve_weights(source):
    """A local file (or folder) for a `weights=` / `--from` source.

    A registry name is downloaded (once) from its URL, `hf:` / `timm:` sources through
    `huggingface_hub`, `http(s)://` URLs into the cache; paths and `gs://` URLs are
    returned unchanged.

    Example:

    >>> resolve_weights("my_weights.npz")
    'my_weights.npz'
    """
    source = os.fspath(source)
    if registry.is_registered(source):
        entry = registry.get_weights(source)
        return fetch(entry.url, sha256=entry.sha256, size=entry.size)
    if source.startswith(("hf:", "timm:")):
        return fetch_hub(source)
    if source.startswith(("http://", "https://")):
        return fetch(source)
    return source
