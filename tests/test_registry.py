"""The registry of official checkpoints: every entry's architecture against the official
parameter counts and the release's file sizes, AugReg file names, and the label sets."""

import keras
import pytest
from helpers import OFFICIAL_COUNTS, OFFICIAL_HYBRID_COUNTS, parameter_counts

import keras_vit
from keras_vit.models import resnet
from keras_vit.models.vit import parse_variant
from keras_vit.weights import registry

OFFICIAL = [e for e in registry.list_weights() if e.url.startswith(registry.OFFICIAL_BASE)]


def _architecture(entry):
    return tuple(sorted((key, repr(value)) for key, value in entry.build_args().items()))


# One test per distinct architecture; entries naming the same model share it.
ARCHITECTURES = {}
for _entry in OFFICIAL:
    ARCHITECTURES.setdefault(_architecture(_entry), []).append(_entry)
# Two quick ones (a resampled grid; a hybrid with the 21843-class head) run always; the
# others take 2-10 s each on two cores.
FAST = {("Ti/16", 384, 1000), ("R+Ti/16", 224, 21843)}


def _expected_count(entry):
    """The official count (vit_jax models_test.py: 1000 classes, 224 px, no
    representation layer) adjusted in closed form to the entry's head, position
    table and pre_logits."""
    arch = parse_variant(entry.variant)
    width = arch["hidden_dim"]
    stages = arch["resnet_stages"]
    stride = arch["patch_size"] * (1 if stages is None else resnet.trunk_stride(stages))
    count = {**OFFICIAL_COUNTS, **OFFICIAL_HYBRID_COUNTS}[entry.variant]
    count += ((entry.image_size // stride) ** 2 - (224 // stride) ** 2) * width
    representation = entry.model_args.get("representation_size")
    if representation:
        count += representation * (width + 1)
    head_input = representation or width
    return count + (entry.num_classes - 1000) * (head_input + 1)


def _is_fast(entries):
    return (entries[0].variant, entries[0].image_size, entries[0].num_classes) in FAST


@pytest.mark.parametrize(
    "entries",
    [e for e in ARCHITECTURES.values() if _is_fast(e)],
    ids=lambda entries: entries[0].name,
)
def test_entry_builds_with_the_official_parameter_count(entries):
    with keras.StatelessScope():
        count = keras_vit.ViT(**entries[0].build_args()).count_params()
    assert count == _expected_count(entries[0])


@pytest.mark.slow
def test_every_other_entry_builds_with_the_official_parameter_count():
    slow = [entries[0] for entries in ARCHITECTURES.values() if not _is_fast(entries)]
    counts = parameter_counts([entry.build_args() for entry in slow])
    assert dict(zip([entry.name for entry in slow], counts)) == {
        entry.name: _expected_count(entry) for entry in slow
    }


@pytest.mark.parametrize("entry", [e for e in OFFICIAL if e.size_mib], ids=lambda e: e.name)
def test_entry_matches_the_released_file_size(entry):
    # float32 tensors: 4 bytes a parameter, within the listing's rounding (whole MiB in
    # the README, 0.01 GiB in gsutil's listing) and the zip headers. A missing pre_logits
    # (B/16: 0.6%) or another head shows.
    size = 4 * _expected_count(entry) / 2**20
    assert abs(size - entry.size_mib) <= max(0.7, 0.005 * entry.size_mib)


def test_registry_covers_the_released_checkpoints():
    names = {e.name for e in OFFICIAL}
    # The authors' recommended AugReg run per variant, pretrained and ImageNet fine-tuned.
    for arch in ("vit_tiny_patch16", "vit_small_patch16", "vit_small_patch32", "vit_base_patch16",
                 "vit_base_patch32", "vit_base_patch8", "vit_large_patch16",
                 "vit_tiny_r_s16_p8", "vit_small_r26_s32", "vit_large_r50_s32"):
        assert f"{arch}_224.augreg_recommended_in21k" in names
        assert any(n.startswith(arch + "_") and n.endswith(".augreg_recommended_in21k_ft_in1k")
                   for n in names)
    recommended = [e for e in OFFICIAL if e.name.endswith("recommended_in21k_ft_in1k")]
    assert all(e.top1 is not None for e in recommended)
    for name in ("vit_huge_patch14_224.orig_in21k", "vit_base_r50_s16_384.orig_in21k_ft_in1k",
                 "vit_large_patch32_384.orig_in21k_ft_in1k"):
        assert name in names
    for entry in OFFICIAL:
        assert entry.model_args["gelu_approximate"] is True  # the JAX checkpoints
        assert len(registry.class_names(entry.labels)) == entry.num_classes
        assert (entry.activation == "sigmoid") == (entry.num_classes == 21843)


def test_every_augreg_file_name_parses_to_its_entry():
    augreg = [e for e in OFFICIAL if "/augreg/" in e.url]
    assert len(augreg) == 49
    for entry in augreg:
        parsed = registry.parse_augreg_name(entry.url)
        assert parsed.model_args() == dict(
            variant=entry.variant, image_size=entry.image_size, num_classes=entry.num_classes
        ), entry.name
        assert entry.url.endswith(".npz") and parsed.dataset == "i21k"
        assert entry.model_args.get("representation_size") is None


def test_augreg_name_fields():
    name = registry.parse_augreg_name(
        "gs://vit_models/augreg/R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
        "--oxford_iiit_pet-steps_0k-lr_0.003-res_384.npz"
    )
    assert (name.model, name.variant, name.dataset, name.epochs, name.lr) == (
        "R_Ti_16", "R+Ti/16", "i21k", 300, 0.001
    )
    assert (name.aug, name.wd, name.do, name.sd) == ("none", 0.03, 0.0, 0.0)
    assert (name.adapt_ds, name.adapt_steps_k, name.adapt_lr, name.adapt_resolution) == (
        "oxford_iiit_pet", 0, 0.003, 384
    )
    assert name.model_args() == dict(variant="R+Ti/16", image_size=384, num_classes=37)
    pretrained = registry.parse_augreg_name("B_8-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0")
    assert pretrained.adapt_ds is None
    assert pretrained.model_args() == dict(variant="B/8", image_size=224, num_classes=1000)


@pytest.mark.parametrize(
    "filename, message",
    [
        ("ViT-B_16.npz", "'ViT-B_16.npz' is not an AugReg file name"),
        ("X_16-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0.npz", "unknown model 'X_16'"),
    ],
)
def test_bad_augreg_names_are_errors(filename, message):
    with pytest.raises(ValueError, match=message):
        registry.parse_augreg_name(filename)


def test_label_sets_are_in_the_checkpoints_class_order():
    imagenet1k = registry.class_names("imagenet1k")
    # ILSVRC-2012 class ids: 0 n01440764 tench, 1 n01443537 goldfish, 207 n02099601
    # golden retriever, 999 n15075141 toilet tissue.
    assert imagenet1k[0].split(",")[0] == "tench"
    assert imagenet1k[1].split(",")[0] == "goldfish"
    assert imagenet1k[207] == "golden retriever"
    assert imagenet1k[999].split(",")[0] == "toilet tissue"
    imagenet21k = registry.class_names("imagenet21k")
    # Google's 21843 classes, by WordNet id (n00004475 first, n15102894 last).
    assert len(imagenet21k) == 21843
    assert imagenet21k[0] == "organism, being"
    with pytest.raises(ValueError, match="Unknown label set 'imagenet22k'"):
        registry.class_names("imagenet22k")


def test_list_weights_and_unknown_names():
    assert {e.variant for e in keras_vit.list_weights("B/16")} == {"B/16"}
    names = [e.name for e in keras_vit.list_weights("vit_small_patch16_*augreg_in21k_ft_in1k")]
    assert names == [
        "vit_small_patch16_224.augreg_in21k_ft_in1k",
        "vit_small_patch16_384.augreg_in21k_ft_in1k",
    ]
    with pytest.raises(ValueError, match="did you mean vit_base_patch16_224.augreg_in21k"):
        registry.get_weights("vit_base_patch16_224.augreg_in21")
    entry = registry.get_weights("vit_base_patch16_224.augreg_in21k")
    with pytest.raises(ValueError, match="already registered with other contents"):
        keras_vit.register_weights(registry.WeightsEntry(entry.name, "https://x/y.npz", "B/16", 224, 10))


def test_vit_with_other_variant_than_the_checkpoint_is_an_error():
    with pytest.raises(ValueError, match="are a ViT-B/16 checkpoint, but variant='S/16'"):
        keras_vit.ViT("S/16", weights="vit_base_patch16_224.augreg_in21k")
