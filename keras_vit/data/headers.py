"""Image files judged from their bytes, without decoding: format, structure, pixel count.

`image_problem` says why bytes are not an image the decoders read whole (empty, another
format, truncated, corrupt inside, more pixels than `max_image_pixels`), or None. It
walks a JPEG's segments and the markers of its entropy-coded data (garbage there shows
as markers libjpeg refuses), checks the checksums of a PNG's critical chunks, and
reads the sizes BMP and WebP files declare. Pure Python, so the start-up check of a
folder runs it in threads; the SavedModel's graph has its own `decode.encoded_pixels`.
"""

import os
import re
import struct
import zlib

FORMATS = "JPEG, PNG, GIF, BMP or WebP"
# Pillow's Image.MAX_IMAGE_PIXELS: an image of 3 bytes a pixel under a quarter of 1 GiB.
DEFAULT_MAX_IMAGE_PIXELS = 1024 * 1024 * 1024 // 4 // 3
MAX_PIXELS_VARIABLE = "KERAS_VIT_MAX_IMAGE_PIXELS"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# The markers libjpeg-turbo reads (jdmarker.c `read_markers`); any other one after a
# 0xFF byte (e.g. 0x3F in garbage) is its "Unsupported marker type" error.
JPEG_MARKERS = frozenset(
    {0x01, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE}
    | set(range(0xC0, 0xD0)) - {0xC8}
    | set(range(0xD0, 0xDA))
    | set(range(0xE0, 0xF0))
)
JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn: no length
JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC9, 0xCA})  # the processes libjpeg decodes
JPEG_OTHER_SOF = frozenset({0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF})
# Where entropy-coded data ends: a 0xFF not followed by a stuffed 0x00, a restart
# marker or another fill byte.
SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def max_image_pixels():
    """The pixel limit: `$KERAS_VIT_MAX_IMAGE_PIXELS` (a positive integer, or `none` for
    no limit), else Pillow's default of 89,478,485 pixels.

    Example:

    >>> max_image_pixels()
    89478485
    """
    text = os.environ.get(MAX_PIXELS_VARIABLE, "").strip()
    if not text:
        return DEFAULT_MAX_IMAGE_PIXELS
    if text.lower() == "none":
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(
        f"{MAX_PIXELS_VARIABLE} must be a positive number of pixels or 'none', got {text!r}."
    )


def image_format(data):
    """`"jpeg"`, `"png"`, `"gif"`, `"bmp"`, `"webp"` from the first bytes, or None."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if data.startswith(b"BM"):
        return "bmp"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "webp"
    return None


def jpeg_problem(data, complete):
    """Why the JPEG `data` would fail libjpeg, or None; `(problem, (width, height))`."""
    size, pos, n, scans = None, 2, len(data), 0
    while pos < n:
        if data[pos] != 0xFF:  # libjpeg skips bytes up to a marker, with a warning
            skip = SCAN_END.search(data, pos)
            if skip is None:
                break
            pos = skip.start()
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos == n:
            break
        marker = data[pos]
        pos += 1
        if marker not in JPEG_MARKERS:
            return f"corrupt JPEG (marker 0x{marker:02X} at byte {pos - 2})", size
        if marker in JPEG_OTHER_SOF:
            return f"unsupported JPEG (lossless or hierarchical, marker 0x{marker:02X})", size
        if marker == 0xD9:  # end of image
            return (None if scans else "corrupt JPEG (no scan)"), size
        if marker in JPEG_STANDALONE:
            continue
        if pos + 2 > n:
            break
        length = int.from_bytes(data[pos:pos + 2], "big")
        if length < 2:
            return f"corrupt JPEG (segment length {length} at byte {pos})", size
        if marker in JPEG_SOF and pos + 7 <= n:
            height, width = struct.unpack(">HH", data[pos + 3:pos + 7])
            size = (width, height)
        if marker == 0xC4 and pos + length <= n:
            if not huffman_tables_fit(data[pos + 2:pos + length]):
                return f"corrupt JPEG (Huffman table at byte {pos})", size
        pos += length
        if marker == 0xDA:  # start of scan: entropy-coded data up to the next marker
            if size is None:
                return "corrupt JPEG (scan before the frame header)", size
            scans += 1
            end = SCAN_END.search(data, pos)
            if end is None:
                break
            pos = end.start()
    return ("truncated JPEG (no end marker)" if complete else None), size


def huffman_tables_fit(tables):
    """Whether a DHT segment's body is whole tables of at most 256 codes each (else
    libjpeg's "Bogus Huffman table definition")."""
    pos = 0
    while pos < len(tables):
        counts = tables[pos + 1:pos + 17]
        codes = sum(counts)
        if len(counts) < 16 or codes > 256:
            return False
        pos += 17 + codes
    return pos == len(tables)


def png_problem(data, complete):
    """Why the PNG `data` would fail libpng (a critical chunk cut short or with a wrong
    checksum), or None; `(problem, (width, height))`."""
    size = struct.unpack(">II", data[16:24]) if len(data) >= 24 else None
    view, pos, n = memoryview(data), 8, len(data)
    while pos + 8 <= n:
        length, kind = struct.unpack(">I4s", view[pos:pos + 8])
        end = pos + 12 + length
        if end > n:
            break
        # Ancillary chunks (lower-case first letter) with a bad checksum libpng drops.
        critical = kind[:1].isupper()
        checksum = int.from_bytes(view[end - 4:end], "big")
        if critical and zlib.crc32(view[pos + 4:end - 4]) != checksum:
            return f"corrupt PNG (checksum of its {kind.decode('latin-1')} chunk)", size
        if kind == b"IEND":
            return None, size
        pos = end
    return ("truncated PNG (no IEND chunk)" if complete else None), size


def bmp_problem(data, complete):
    """A BMP shorter than its uncompressed pixel rows; `(problem, (width, height))`."""
    if len(data) < 30:
        return "truncated BMP (no header)", None
    offset, header = struct.unpack("<II", data[10:18])
    if header == 12:  # OS/2 BITMAPCOREHEADER
        width, height = struct.unpack("<HH", data[18:22])
        bits, compression = data[24], 0
    else:
        width, height, _, bits = struct.unpack("<iiHH", data[18:30])
        compression = struct.unpack("<I", data[30:34])[0] if len(data) >= 34 else 0
    size = (abs(width), abs(height))
    needed = offset + (bits * size[0] + 31) // 32 * 4 * size[1]
    if complete and compression == 0 and len(data) < needed:
        return f"truncated BMP ({len(data)} of {needed} bytes)", size
    return None, size


def webp_problem(data, complete):
    """A WebP shorter than its RIFF size; `(problem, (width, height))`."""
    declared = int.from_bytes(data[4:8], "little") + 8
    chunk, size = data[12:16], None
    if chunk == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        size = (width & 0x3FFF, height & 0x3FFF)
    elif chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        size = ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    elif chunk == b"VP8X" and len(data) >= 30:
        width, height = (int.from_bytes(data[i:i + 3], "little") + 1 for i in (24, 27))
        size = (width, height)
    if complete and len(data) < declared:
        return f"truncated WebP ({len(data)} of {declared} bytes)", size
    return None, size


def gif_problem(data, complete):
    """A GIF whose first image runs past its end (giflib refuses it; a later frame cut
    short or a missing trailer it reads); `(problem, (width, height))`."""
    if len(data) < 13:
        return ("truncated GIF (no screen descriptor)" if complete else None), None
    size = struct.unpack("<HH", data[6:10])
    pos, n, images = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0), len(data), 0
    while pos < n and data[pos] != 0x3B and not images:  # up to the trailer or an image
        if data[pos] == 0x21:  # extension: label, then sub-blocks
            pos += 2
        elif data[pos] == 0x2C and pos + 10 <= n:  # image: descriptor, colours, LZW size
            flags, images = data[pos + 9], 1
            pos += 11 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
        else:
            return (f"corrupt GIF (block 0x{data[pos]:02X} at byte {pos})"
                    if complete or pos + 10 <= n else None), size
        while pos < n and data[pos]:  # sub-blocks, each its length then its bytes
            pos += data[pos] + 1
        pos += 1
    if complete and (pos > n or not images):
        return "truncated GIF (its first image runs past the end)", size
    return None, size


PROBLEMS = {
    "jpeg": jpeg_problem, "png": png_problem, "gif": gif_problem,
    "bmp": bmp_problem, "webp": webp_problem,
}


def image_problem(data, *, complete=True, max_pixels="default"):
    """Why `data` (a file's bytes) is not an image the decoders read whole, or None.

    Args:
        data: the file's bytes, or with `complete=False` its first bytes (a listing of
            a remote folder reads no more): then only what they show is judged.
        complete: whether `data` is the whole file.
        max_pixels: the pixel limit (default `max_image_pixels()`; None: no limit).

    Returns:
        One phrase ("empty", "truncated PNG (no IEND chunk)", "20000x20000 pixels, over
        the limit of ...") or None.

    Example:

    >>> image_problem(b"<html>404</html>")
    'not a JPEG, PNG, GIF, BMP or WebP file'
    """
    if not data:
        return "empty"
    kind = image_format(data)
    if kind is None:
        return f"not a {FORMATS} file"
    problem, size = PROBLEMS[kind](data, complete)
    if problem:
        return problem
    limit = max_image_pixels() if max_pixels == "default" else max_pixels
    if limit is not None and size is not None and size[0] * size[1] > limit:
        return (
            f"{size[0]}x{size[1]} pixels, over the limit of {limit} "
            f"(set {MAX_PIXELS_VARIABLE} to raise it)"
        )
    return None
