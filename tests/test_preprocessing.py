"""Preprocessing belongs to the checkpoint: DeiT's ImageNet mean/std, bicubic resize and
crop reach every path (classify, predict, the SavedModel), against HF transformers'
image processors and pipeline as the independent reference; plain ViTs are unchanged.
Each resize filter against its reference's own implementation on real photos (HF's
image processors, PIL as timm's transforms call it), and `read_images`' TensorFlow-free
decoding and resizing against the `tf.data` path's, bit for bit.
"""

import io
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from sklearn.datasets import load_sample_images
from transformers import (
    BitImageProcessor,
    CLIPImageProcessor,
    DeiTConfig,
    DeiTForImageClassification,
    DeiTImageProcessor,
    SiglipImageProcessor,
    ViTImageProcessor,
    pipeline,
)

import keras_vit
from keras_vit import cli, data
from keras_vit.data import decode, headers, images, libjpeg
from keras_vit.models import preprocessing as prep
from keras_vit.weights import registry
from keras_vit.weights.formats import hf_preprocessing
from references import randomise

IMAGENET = dict(mean=list(prep.IMAGENET_MEAN), std=list(prep.IMAGENET_STD))
SIZE, CROP_FROM = 32, 36  # HF DeiT's 224 of 256, scaled down
HF_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=64, image_size=SIZE, patch_size=8, num_labels=10)


def photo(seed, size=48):
    """A smooth square RGB uint8 image (a photo's spectrum: resizing matters, but softly)."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (6, 6, 3))
    image = tf.image.resize(coarse[None], (size, size), method="bicubic")[0].numpy()
    return np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype("uint8")


@pytest.fixture(scope="module")
def deit_dir(tmp_path_factory):
    """A randomised HF DeiT classifier with HF DeiT's image-processor config, scaled down."""
    directory = tmp_path_factory.mktemp("deit_pre")
    randomise(DeiTForImageClassification(DeiTConfig(**HF_CONFIG)), seed=4).save_pretrained(directory)
    DeiTImageProcessor(
        size={"height": CROP_FROM, "width": CROP_FROM}, crop_size={"height": SIZE, "width": SIZE},
        image_mean=IMAGENET["mean"], image_std=IMAGENET["std"], resample=3,
    ).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("photos")
    paths = []
    for seed in range(6):
        path = str(folder / f"p{seed}.png")
        Image.fromarray(photo(seed)).save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize("processor, preprocessing", [
    (DeiTImageProcessor(image_mean=IMAGENET["mean"], image_std=IMAGENET["std"]),
     dict(IMAGENET, interpolation="bicubic")),
    (ViTImageProcessor(), None),  # 0.5 / 0.5: the official checkpoints' [-1, 1]
])
def test_normalisation_matches_hf_image_processors(processor, preprocessing):
    """On an image already at the model's size (no resize, no crop), the model input
    equals HF's `pixel_values` (HF rescales by 1/255 first: float32 rounding apart)."""
    image = photo(1, SIZE)
    reference = processor(image, do_resize=False, do_center_crop=False,
                          return_tensors="np")["pixel_values"][0].transpose(1, 2, 0)
    ours = keras.ops.convert_to_numpy(keras_vit.preprocess(image[None], preprocessing))[0]
    np.testing.assert_allclose(ours, reference, atol=2e-6)


def test_bicubic_resize_is_pils_within_a_pixel_level():
    """The bicubic resize against PIL's (HF's and timm's eval resize), down and up.

    TensorFlow's antialiased Keys kernel is PIL's a=-0.5 cubic scaled by the shrink
    factor; PIL resizes in two passes (rows, then columns), each rounded and clipped to
    uint8. Rounding alone is up to 0.5 of a level (0.25 on average); the first pass's
    rounding, carried through the second pass's kernel (weights summing to 1 in
    absolute value up to ~1.2), adds up to ~0.7 when shrinking, and where an enlarged
    steep edge overshoots and the first pass clipped it, up to ~3 levels. So: at most
    1.5 levels shrinking (the eval path: photos above the model's size), 3.5 enlarging,
    0.35 on average. Bilinear without antialiasing, the official ViTs' resize, is far
    from it when shrinking: the negative control.
    """
    image = photo(2, 64)
    for size, bound in ((36, 1.5), (29, 1.5), (90, 3.5), (128, 3.5)):
        pil = np.asarray(Image.fromarray(image).resize((size, size), Image.BICUBIC), "float32")
        ours = data.eval_resize(image, (size, size), interpolation="bicubic").numpy()
        assert np.abs(ours - pil).max() <= bound, size
        assert np.abs(ours - pil).mean() < 0.35, size
    bilinear = data.eval_resize(image, (29, 29)).numpy()
    pil = np.asarray(Image.fromarray(image).resize((29, 29), Image.BICUBIC), "float32")
    assert np.abs(bilinear - pil).max() > 10


def test_hf_directory_records_its_preprocessor_config(deit_dir, tmp_path):
    model = keras_vit.pretrained(deit_dir)
    assert model.get_config()["preprocessing"] == dict(
        IMAGENET, interpolation="bicubic", antialias=True, crop_fraction=SIZE / CROP_FROM)
    # A fine-tune from it keeps it, and so does its .keras file: it stays self-describing.
    tuned = keras_vit.ViT(weights=str(deit_dir), num_classes=3)
    path = str(tmp_path / "tuned.keras")
    tuned.save(path)
    loaded = keras.saving.load_model(path)
    assert prep.model_preprocessing(loaded) == model.get_config()["preprocessing"]


def test_predict_on_an_hf_deit_directory_gives_hf_pipelines_top1(deit_dir, photos, capsys):
    """`keras-vit predict --weights DIR` against transformers' image-classification
    pipeline (its own processor from preprocessor_config.json) on the same files.

    The images are square, so HF's resize to 36x36 then crop equals keras-vit's
    resize of the short side then crop; the probabilities then agree to the resize
    difference (below 0.005: PIL rounds to uint8 between its two passes). The [-1, 1]
    scaling every model got before misses them by more than 0.02 (the control).
    """
    classifier = pipeline("image-classification", model=str(deit_dir))
    hf = [classifier(path, top_k=10) for path in photos]
    assert cli.main(["predict", "--weights", str(deit_dir), *photos, "--json",
                     "--top-k", "10"]) == 0
    ours = json.loads(capsys.readouterr().out)
    label2id = classifier.model.config.label2id
    for theirs, mine in zip(hf, ours, strict=True):
        assert label2id[theirs[0]["label"]] == mine["top_k"][0]["class"]
        hf_probs = {label2id[t["label"]]: t["score"] for t in theirs}
        np.testing.assert_allclose(
            [t["probability"] for t in mine["top_k"]],
            [hf_probs[t["class"]] for t in mine["top_k"]], atol=5e-3,
        )
    model = keras_vit.pretrained(deit_dir)
    old = model.predict(data.read_images(photos, SIZE), verbose=0)
    old = np.exp(old) / np.exp(old).sum(-1, keepdims=True)
    hf_rows = np.array([[{label2id[t["label"]]: t["score"] for t in r}[i] for i in range(10)]
                        for r in hf])
    assert np.abs(old - hf_rows).max() > 2e-2


def test_saved_model_of_a_deit_serves_classifys_probabilities(deit_dir, photos, tmp_path):
    if keras.backend.backend() not in ("tensorflow", "jax"):
        pytest.skip("SavedModel export runs on TensorFlow or JAX")
    model = keras_vit.pretrained(deit_dir)
    keras_vit.export_saved_model(model, str(tmp_path / "sm"), top_k=10)
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_bytes"]
    out = served(image_bytes=tf.constant([open(p, "rb").read() for p in photos]))
    expected = keras_vit.classify(model, photos, top_k=10)
    for row, probabilities, result in zip(
        out["top_k_indices"].numpy(), out["top_k_probabilities"].numpy(), expected
    ):
        assert row.tolist() == [t["class"] for t in result["top_k"]]
        np.testing.assert_allclose(probabilities, [t["probability"] for t in result["top_k"]],
                                   atol=1e-5)


def test_a_plain_vit_is_unchanged_bit_for_bit(photos, tmp_path):
    """No preprocessing recorded; classify's input is exactly the old
    `(bilinear resize - 127.5) / 127.5`, so its probabilities are bit for bit."""
    model = keras_vit.ViT(image_size=SIZE, patch_size=8, hidden_dim=32, num_layers=1,
                          num_heads=4, mlp_dim=64, num_classes=3, head_bias_init=0.0)
    assert "preprocessing" not in model.get_config()
    pixels = np.stack([
        tf.image.resize(np.asarray(Image.open(p)).astype("float32"), (SIZE, SIZE)).numpy()
        for p in photos
    ])
    np.testing.assert_array_equal(data.read_images(photos, SIZE), (pixels - 127.5) / 127.5)


def test_registry_entries_carry_their_checkpoints_preprocessing():
    """timm's pretrained_cfg for DeiT (deit.py: ImageNet mean/std, bicubic, crop_pct 0.9,
    1.0 at 384 px and for DeiT III's in22k fine-tunes); [-1, 1] whole-image bilinear for
    the official ViTs, whose build arguments stay as they were."""
    deit = registry.get_weights("deit_small_patch16_224.fb_in1k").build_args()["preprocessing"]
    assert deit == dict(IMAGENET, interpolation="bicubic", antialias=True, crop_fraction=0.9)
    assert registry.get_weights("deit_base_patch16_384.fb_in1k").crop_fraction == 1.0
    assert registry.get_weights("deit3_base_patch16_224.fb_in22k_ft_in1k").crop_fraction == 1.0
    official = [e for e in registry.list_weights() if e.url.startswith(registry.OFFICIAL_BASE)]
    assert len(official) > 50
    for entry in official:  # not the image towers also named vit_* (test_towers)
        assert entry.preprocessing == prep.DEFAULT and "preprocessing" not in entry.build_args()


def test_bad_preprocessing_is_one_line_naming_it():
    with pytest.raises(ValueError, match="unknown fields scale"):
        prep.check_preprocessing({"scale": 2})
    with pytest.raises(ValueError, match="Unknown preprocessing interpolation 'area'"):
        prep.check_preprocessing({"interpolation": "area"})
    with pytest.raises(ValueError, match="std must be 1 or 3 numbers.*got \\[0, 1, 1\\]"):
        prep.check_preprocessing({"std": [0, 1, 1]})
    with pytest.raises(ValueError, match="antialias must be True .* or False .*got 'yes'"):
        prep.check_preprocessing({"antialias": "yes"})
    with pytest.raises(ValueError, match="antialias=False is TensorFlow's bilinear resize only"):
        prep.check_preprocessing({"interpolation": "bicubic", "antialias": False})


def test_values_recorded_without_antialias_keep_their_meaning():
    """Configs, run folders and registry entries written before `antialias` existed:
    "bilinear" is TensorFlow's resize (no antialiasing), "bicubic" the antialiased one,
    the pixels they gave then; every checked dict records the field."""
    assert prep.check_preprocessing({"interpolation": "bilinear"})["antialias"] is False
    assert prep.check_preprocessing({"interpolation": "bicubic"})["antialias"] is True
    assert prep.check_preprocessing({})["antialias"] is False
    image = tf.constant(np.asarray(Image.open(load_sample_images().filenames[0])), tf.float32)
    np.testing.assert_array_equal(
        data.eval_resize(image, (224, 224)).numpy(),
        tf.image.resize(image, (224, 224), method="bilinear").numpy())
    np.testing.assert_array_equal(
        data.eval_resize(image, (224, 224), interpolation="bicubic").numpy(),
        tf.clip_by_value(tf.image.resize(image, (224, 224), method="bicubic", antialias=True),
                         0, 255).numpy())


def test_a_run_from_a_deit_directory_normalises_and_records_its_preprocessing(deit_dir):
    """The engine takes the init_from weights' preprocessing (its pipelines normalise
    with it, its model records it): here against ImageNet's formula on the digits."""
    from keras_vit.data.sources import load_source
    from keras_vit.training.config import TrainConfig
    from keras_vit.training.engine import run_preprocessing

    config = TrainConfig(model=dict(variant="custom", image_size=SIZE, init_from=str(deit_dir),
                                    kwargs=dict(patch_size=8, hidden_dim=32, num_layers=2,
                                                num_heads=4, mlp_dim=64)))
    expected = keras_vit.pretrained(deit_dir).get_config()["preprocessing"]
    assert run_preprocessing(config) == expected
    source = load_source("digits", "test")
    plain, _ = next(iter(data.eval_dataset(source, SIZE, 8, crop_fraction=None)))
    deit, _ = next(iter(data.eval_dataset(source, SIZE, 8, crop_fraction=None,
                                          preprocessing=dict(expected, interpolation="bilinear",
                                                             antialias=False))))
    pixels = plain.numpy() * 127.5 + 127.5
    reference = (pixels / 255 - np.array(IMAGENET["mean"])) / np.array(IMAGENET["std"])
    np.testing.assert_allclose(deit.numpy(), reference, atol=1e-4)


def test_probe_scores_a_deit_with_its_checkpoints_preprocessing(deit_dir, tmp_path, capsys):
    """`keras-vit probe` feeds the model its checkpoint's preprocessing (ImageNet mean/std,
    bicubic, its crop), the evaluation pipeline the HF comparisons above check: its clean
    accuracy on the 360 test digits is the model's accuracy on that pipeline's images."""
    model = keras_vit.pretrained(str(deit_dir))
    saved = str(tmp_path / "deit.keras")
    model.save(saved)
    source = data.load_source("digits", "test")
    preprocessing = prep.model_preprocessing(model)
    dataset = data.eval_dataset(source, SIZE, 64, channels=3,
                                crop_fraction=preprocessing["crop_fraction"],
                                preprocessing=preprocessing)
    hits = [np.argmax(keras.ops.convert_to_numpy(model(images)), -1) == np.argmax(labels, -1)
            for images, labels in dataset]
    expected = np.concatenate(hits).mean()
    assert cli.main(["probe", "--from", saved, "--data", "digits", "--drop", "0", "--grids", "2",
                     "--out", str(tmp_path / "probes")]) == 0
    printed = capsys.readouterr().out
    assert f"clean accuracy {expected:.4f}" in printed, printed


@pytest.fixture(scope="module")
def real_photos(tmp_path_factory):
    """scikit-learn's two sample photos (china.jpg, flower.jpg: 640x427 JPEGs, shipped
    with it), whole, and their central 427x427 squares as PNGs (lossless)."""
    folder = tmp_path_factory.mktemp("real_photos")
    whole = list(load_sample_images().filenames)
    squares = []
    for path in whole:
        square = str(folder / (os.path.basename(path)[:-4] + "_square.png"))
        Image.open(path).crop((106, 0, 533, 427)).save(square)
        squares.append(square)
    return {"whole": whole, "square": squares}


def grey_levels(ours, theirs, std):
    """|ours - theirs| of model inputs in 8-bit grey levels (`* 255 std`)."""
    return np.abs(ours - theirs) * np.asarray(std, "float32") * 255


# (reference, its photos): the processors of the HF releases (ViT's resample 2, SigLIP's
# 3, SigLIP 2's 2, CLIP's, DeiT's and DINOv2's crops).
HF_PROCESSORS = {
    "vit": (ViTImageProcessor, {}, "whole"),
    "siglip": (SiglipImageProcessor, {}, "whole"),
    "siglip2": (SiglipImageProcessor, {"resample": 2}, "whole"),
    "clip": (CLIPImageProcessor, {}, "square"),
    "deit": (DeiTImageProcessor, {}, "square"),
    "dinov2": (BitImageProcessor, dict(size={"shortest_edge": 256}, crop_size=224,
                                       image_mean=list(prep.IMAGENET_MEAN),
                                       image_std=list(prep.IMAGENET_STD)), "square"),
}


@pytest.mark.parametrize("name", HF_PROCESSORS)
def test_hf_directories_get_their_image_processors_pixels_on_real_photos(
        name, real_photos, tmp_path):
    """An HF directory's preprocessing (`hf_preprocessing` of its saved processor) gives
    `read_images` the pixels its own image processor gives (transformers' PIL path: it
    resizes with PIL, `resample` 2 bilinear or 3 bicubic, both antialiased), at 224 px.

    PIL rounds to uint8 after each of its two passes and keras-vit does not: measured,
    0.28 grey levels on average, 99th percentile 0.73 (bilinear) to 0.80 (bicubic), at
    most 1 level for bilinear and 5 for bicubic (a steep edge that PIL's first pass
    clipped). The crops are checked on square photos: on others HF resizes the long side
    to a truncated length where keras-vit (as big_vision) rounds it.
    """
    processor_type, options, photos = HF_PROCESSORS[name]
    processor = processor_type(**options)
    processor.save_pretrained(tmp_path)
    preprocessing = hf_preprocessing(str(tmp_path))
    assert preprocessing["antialias"] is True
    assert preprocessing["interpolation"] == ("bilinear" if processor.resample == 2 else "bicubic")
    differences = []
    for path in real_photos[photos]:
        ours = data.read_images([path], 224, crop_fraction=preprocessing["crop_fraction"],
                                preprocessing=preprocessing)[0]
        theirs = processor(Image.open(path), return_tensors="np")["pixel_values"][0]
        differences.append(grey_levels(ours, theirs.transpose(1, 2, 0), preprocessing["std"]))
    difference = np.concatenate([d.ravel() for d in differences])
    assert difference.mean() < 0.3
    assert np.percentile(difference, 99) < 0.85
    assert difference.max() <= (1 if preprocessing["interpolation"] == "bilinear" else 5.5)


def test_tensorflows_bilinear_is_far_from_pils_on_real_photos(real_photos):
    """The negative control: TensorFlow's bilinear resize (no antialiasing, the official
    ViTs' and the old reading of an HF directory's resample 2) against HF ViT's own
    pixels, on the whole photos brought to 224 px: 6.4 grey levels on average on
    china.jpg, 1.5 on flower.jpg (99th percentiles 48 and 20)."""
    processor = ViTImageProcessor()
    differences = []
    for path in real_photos["whole"]:
        ours = data.read_images([path], 224)[0]
        theirs = processor(Image.open(path), return_tensors="np")["pixel_values"][0]
        differences.append(grey_levels(ours, theirs.transpose(1, 2, 0), 0.5))
    difference = np.concatenate([d.ravel() for d in differences])
    assert difference.mean() > 3 and np.percentile(difference, 99) > 30


@pytest.mark.parametrize("interpolation, pil_filter", [("bilinear", Image.BILINEAR),
                                                       ("bicubic", Image.BICUBIC)])
def test_timm_style_preprocessing_is_pils_resize_on_real_photos(
        interpolation, pil_filter, real_photos):
    """timm evaluates with torchvision's transforms on PIL images: `Resize` of the short
    side to `image_size / crop_pct` with PIL's filter of `pretrained_cfg["interpolation"]`,
    then `CenterCrop`. timm's `create_transform` needs torchvision, which is not installed
    here, so the reference is PIL's resize itself as those transforms call it (on square
    photos, where both crop the same window), for timm's DeiT (bicubic, crop_pct 0.875)
    and a bilinear one (SigLIP 2): within PIL's 8-bit rounding, as above."""
    preprocessing = dict(mean=list(prep.IMAGENET_MEAN), std=list(prep.IMAGENET_STD),
                         interpolation=interpolation, antialias=True, crop_fraction=0.875)
    differences = []
    for path in real_photos["square"]:
        resized = Image.open(path).convert("RGB").resize((256, 256), pil_filter)
        crop = np.asarray(resized, "float32")[16:240, 16:240]
        theirs = (crop / 255 - np.array(prep.IMAGENET_MEAN)) / np.array(prep.IMAGENET_STD)
        ours = data.read_images([path], 224, crop_fraction=0.875, preprocessing=preprocessing)
        differences.append(grey_levels(ours[0], theirs, prep.IMAGENET_STD))
    difference = np.concatenate([d.ravel() for d in differences])
    assert difference.mean() < 0.3 and np.percentile(difference, 99) < 0.85


@pytest.mark.parametrize("interpolation, antialias", [("bilinear", False), ("bilinear", True),
                                                      ("bicubic", True)])
def test_read_images_resizes_as_tensorflow_does_bit_for_bit(interpolation, antialias, real_photos):
    """`read_images` resizes in NumPy (no TensorFlow); the pipelines and the SavedModel
    with `tf.image.resize`. The same float32 operations in the same order: equal bits,
    shrinking, enlarging and both at once, whole and cropped."""
    pixels = images.decode_file(open(real_photos["whole"][0], "rb").read(), 3)
    for size in ((224, 224), (300, 500), (1000, 700), (17, 640)):
        np.testing.assert_array_equal(
            images.resize(pixels, size, interpolation, antialias),
            decode.resize(tf.constant(pixels, tf.float32), size, interpolation, antialias).numpy())
    for crop_fraction in (None, 0.875, 1.0):
        np.testing.assert_array_equal(
            images.eval_resize(pixels, (224, 224), crop_fraction,
                               dict(interpolation=interpolation, antialias=antialias)),
            data.eval_resize(pixels, (224, 224), crop_fraction, interpolation, antialias).numpy())


def encoded(image, fmt, **options):
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


@pytest.mark.parametrize("channels", [1, 3])
def test_files_decode_to_the_same_bytes_with_pil_and_tensorflow(channels, real_photos):
    """TensorFlow decodes JPEGs with libjpeg's accurate IDCT (`DCT_METHOD`), PIL's: the
    real photos (colour, 4:2:0) and JPEGs of them (4:4:4, progressive, grey, CMYK), and
    the colour photo in every other format (PNG with and without its ICC profile, with
    alpha, with a palette; GIF, BMP, WebP lossy and lossless), decode to equal bytes in
    `read_images`' decoder and the evaluation pipeline's and the SavedModel's, to 1
    channel (each format's own conversion) and 3. The one decode `read_images` gives a
    clean JPEG (`libjpeg.decode_clean`) takes every JPEG but the CMYK one, to those bytes."""
    photo = Image.open(real_photos["whole"][1]).resize((160, 120))
    plain = Image.fromarray(np.asarray(photo))  # without the JPEG's ICC profile
    rgba = Image.fromarray(np.dstack([np.asarray(photo), np.asarray(photo)[..., :1]]))
    payloads = [open(path, "rb").read() for path in real_photos["whole"]] + [
        encoded(photo, "JPEG", quality=90, subsampling=0),
        encoded(photo, "JPEG", quality=90, progressive=True),
        encoded(photo.convert("L"), "JPEG", quality=90),
        cmyk := encoded(photo.convert("CMYK"), "JPEG", quality=90),
        encoded(photo, "PNG"), encoded(plain, "PNG"), encoded(rgba, "PNG"),
        encoded(plain.convert("P", palette=Image.Palette.ADAPTIVE), "PNG"),
        encoded(plain.convert("P", palette=Image.Palette.ADAPTIVE), "GIF"),
        encoded(plain, "BMP"), encoded(plain, "WEBP", quality=80),
        encoded(plain, "WEBP", lossless=True),
    ]
    for payload in payloads:
        ours = images.decode_file(payload, channels)
        tensor = tf.constant(payload)
        np.testing.assert_array_equal(
            ours, decode.decode_crop(tensor, True, channels, decode.full_window))
        np.testing.assert_array_equal(ours, decode.decode_pixels(tensor, channels))
        clean = libjpeg.decode_clean(payload, channels)
        if headers.image_format(payload) == "jpeg" and payload is not cmyk:
            np.testing.assert_array_equal(clean, ours)
        else:
            assert clean is None
