"""source=mix (datasets/mix/source.py, datasets/mix/order.py): the draw, the class merge, per-part stacks and
accuracy, and the errors that name a part."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from feedline.datamodules.loaders import ImageLoaders
from feedline.datasets.folder.source import FolderSource
from feedline.datasets.mix.order import mix_order, part_seed, quotas, stream
from feedline.datasets.mix.source import MixSource
from feedline.transforms.collate import DefaultCollate, Uint8Collate
from feedline.transforms.stacks import TransformStacks
from tests.helpers import simple_tree


def folder(tmp_path, name, classes=("cat", "dog", "eel"), per_class=6, val_fraction=0.0):
    tree = simple_tree(tmp_path / name, classes=classes, per_class=per_class)
    return FolderSource(tree, val_fraction=val_fraction, cache_dir=tmp_path / "cache")


def mix(tmp_path, base: dict | None = None, extra: dict | None = None, **kwargs) -> MixSource:
    parts = {
        "base": {"source": folder(tmp_path, "base", per_class=10), "weight": 0.8, **(base or {})},
        "extra": {"source": folder(tmp_path, "extra", per_class=4), "weight": 0.2, **(extra or {})},
    }
    source = MixSource(parts, **kwargs)
    source.prepare()
    return source


def parts_of(records, order) -> np.ndarray:
    return np.searchsorted(records.offsets, order, side="right") - 1


# -- the draw -------------------------------------------------------------------------------------------
def test_quotas_follow_the_weights_exactly_and_fixed_counts_as_given():
    assert quotas([1000, 10], [0.8, 0.2], [None, None], 1000).tolist() == [800, 200]
    assert quotas([5, 5, 5], [1, 1, 1], [None, None, None], 10).tolist() == [4, 3, 3]  # sums to 10, not 9
    assert quotas([100, 7], [1.0, None], [None, 50], None).tolist() == [100, 50]  # null: sizes + counts
    assert quotas([100, 7], [1.0, None], [None, 50], 80).tolist() == [30, 50]
    with pytest.raises(ValueError, match=r"source.epoch_size=40 does not match the parts' fixed counts"):
        quotas([100, 7], [1.0, None], [None, 50], 40)
    # every part a fixed count: a larger epoch has nothing to fill it, and "at least that" would not do
    with pytest.raises(
        ValueError, match=r"source.epoch_size=200 cannot be filled: .* an epoch is exactly 80"
    ):
        quotas([100, 7], [None, None], [30, 50], 200)


def test_each_epoch_draws_each_part_its_quota_and_the_draw_is_a_function_of_seed_and_epoch(tmp_path):
    train = mix(tmp_path, epoch_size=50).split("train")
    assert train.drawn() == {"base": 40, "extra": 10} and train.epoch_samples() == 50
    for epoch in range(3):
        order = train.epoch_order(7, epoch)
        assert len(order) == 50 and collections.Counter(parts_of(train, order).tolist()) == {0: 40, 1: 10}
        assert np.array_equal(order, train.epoch_order(7, epoch))  # the same in every rank and resumed run
    assert not np.array_equal(train.epoch_order(7, 0), train.epoch_order(7, 1))
    assert not np.array_equal(train.epoch_order(7, 0), train.epoch_order(8, 0))


def test_proportions_hold_within_one_batch_in_every_stretch_of_the_epoch(tmp_path):
    """Slots are shuffled, not laid out part after part: any run of batches sees the weights, give or take."""
    train = mix(tmp_path, epoch_size=1000).split("train")
    share = parts_of(train, train.epoch_order(0, 0)).reshape(10, 100).mean(axis=1)  # extra's share per 100
    assert np.all(np.abs(share - 0.2) < 0.12), share


def test_a_part_smaller_than_its_quota_repeats_evenly_and_a_larger_one_covers_all_before_repeating():
    size = 10
    order = lambda seed, k: np.random.default_rng([seed, k]).permutation(size)  # noqa: E731
    over = stream(order, size, 3, 0, 25)  # 25 from 10: each twice or three times
    assert set(collections.Counter(over.tolist()).values()) <= {2, 3}
    under = [stream(order, size, 3, e * 4, 4) for e in range(3)]  # 4 an epoch: epochs 0-1 and half of 2
    assert len(set(np.concatenate(under[:2]).tolist())) == 8  # no repeat before the part is used up


def test_a_shards_like_part_keeps_its_own_order_inside_the_mix():
    """A part with its own epoch order (shards: chunk by chunk) is read in that order in its slots."""
    own = lambda seed, k: np.roll(np.arange(12), seed % 12 + k)  # noqa: E731 - a recognisable order
    plain = lambda seed, k: np.random.default_rng([seed, k]).permutation(8)  # noqa: E731
    counts = np.array([12, 8])
    order = mix_order([own, plain], [12, 8], [0, 12], counts, seed=5, epoch=0)
    assert order[order < 12].tolist() == own(part_seed(5, 0), 0).tolist()


# -- classes --------------------------------------------------------------------------------------------
def test_classes_merge_by_name_first_part_first_and_map_or_label_a_part(tmp_path):
    base = {"source": folder(tmp_path, "a", classes=("dog", "cat"))}
    extra = {"source": folder(tmp_path, "b", classes=("cat", "wolf", "puppy"))}
    assert MixSource({"base": base, "extra": extra}).classes == ["cat", "dog", "puppy", "wolf"]
    mapped = MixSource({"base": base, "extra": {**extra, "class_map": {"puppy": "dog", "wolf": "dog"}}})
    assert mapped.classes == ["cat", "dog"]
    train = mapped.split("train")
    labels = [train[i][1] for i in range(len(train))]
    extra_labels = collections.Counter(labels[int(train.offsets[1]) :])
    assert extra_labels == {0: 6, 1: 12}  # cat 6; puppy and wolf merged into dog
    labelled = MixSource({"base": base, "extra": {**extra, "label": "synthetic"}})
    assert labelled.classes == ["cat", "dog", "synthetic"]
    assert {labelled.split("train")[i][1] for i in range(12, 30)} == {2}


def test_classes_that_cannot_merge_are_refused_naming_the_part_and_the_classes(tmp_path):
    base = {"source": folder(tmp_path, "a", classes=("cat", "dog"))}
    numbered = {"source": folder(tmp_path, "n", classes=("0", "1"))}
    with pytest.raises(
        ValueError, match=r"source.parts.extra has numbered classes \(0, 1.*source.parts.base named"
    ):
        _ = MixSource({"base": base, "extra": numbered}).classes
    assert MixSource(
        {"base": base, "extra": {**numbered, "class_map": {"0": "cat", "1": "dog"}}}
    ).classes == [
        "cat",
        "dog",
    ]
    with pytest.raises(
        ValueError, match=r"source.parts.extra.class_map maps 'kitten', which extra does not have"
    ):
        _ = MixSource({"base": base, "extra": {**numbered, "class_map": {"kitten": "cat"}}}).classes


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"weight": 1, "samples": 5}, r"source.parts.extra: give a weight or samples"),
        ({"weight": 0}, r"source.parts.extra.weight=0: a number above 0"),
        ({"samples": 2.5}, r"source.parts.extra.samples=2.5"),
        ({"colour": 1}, r"source.parts.extra: unknown key\(s\) colour"),
        ({"source": None}, r"source.parts.extra.source is required"),
    ],
)
def test_bad_part_settings_are_refused_by_key(tmp_path, spec, said):
    with pytest.raises(ValueError, match=said):
        MixSource(
            {"base": {"source": folder(tmp_path, "a")}, "extra": {"source": folder(tmp_path, "a"), **spec}}
        )


def test_a_part_that_fails_to_load_is_named(tmp_path):
    broken = {"_target_": "feedline.datasets.folder.source.FolderSource", "root": str(tmp_path / "nowhere")}
    with pytest.raises(FileNotFoundError, match=r"^source.parts.extra.source.root .*nowhere. does not exist"):
        MixSource({"base": {"source": folder(tmp_path, "a")}, "extra": {"source": broken}})
    empty = simple_tree(tmp_path / "empty", per_class=0)
    source = MixSource(
        {"base": {"source": folder(tmp_path, "a")}, "extra": {"source": {**broken, "root": empty}}}
    )
    with pytest.raises(Exception, match=r"source.parts.extra"):
        source.prepare()
    with pytest.raises(ValueError, match=r"source.parts is empty"):
        MixSource({})


def test_the_source_and_its_splits_pickle_small(tmp_path):
    source = mix(tmp_path, base={"source": folder(tmp_path, "big", per_class=300)})
    train = source.split("train")
    assert len(train) == 900 + 12 and len(pickle.dumps(train)) < 4000
    clone = pickle.loads(pickle.dumps(train))
    assert [clone[i][1] for i in (0, 500, 911)] == [train[i][1] for i in (0, 500, 911)]
    assert clone.describe(911).startswith("extra: ") and "extra" in clone.describe(911)


# -- through the datamodule -----------------------------------------------------------------------------
def loaders(source, collate=None, num_workers=0) -> ImageLoaders:
    stacks = TransformStacks(
        train=[v2.Resize((8, 8), antialias=True)], eval=[v2.Resize((8, 8), antialias=True)]
    )
    collate = collate or DefaultCollate()
    return ImageLoaders(source, stacks, collate, batch_size=5, num_workers=num_workers, seed=3)


def test_a_part_with_its_own_stack_gets_it_and_both_parts_collate_into_one_batch(tmp_path):
    invert = [v2.Resize((8, 8), antialias=True), v2.RandomInvert(p=1.0)]
    data = loaders(mix(tmp_path, extra={"transforms": invert}))
    data.setup("fit")
    train = data.datasets["train"]
    extra_row = int(train.records.offsets[1])
    image, _ = train[extra_row]
    payload, _ = train.records[extra_row]
    plain = v2.Resize((8, 8), antialias=True)(train.decode(payload))
    assert torch.equal(image, 255 - plain)  # the part's stack, not the run's
    base_image, _ = train[0]
    assert torch.equal(base_image, v2.Resize((8, 8), antialias=True)(train.decode(train.records[0][0])))
    parts = set()
    for batch in data.train_dataloader():
        assert batch[0].shape[1:] == (3, 8, 8)
        parts.add(len(batch[0]))
    assert parts  # batches of both parts' images


def test_an_epoch_reads_each_drawn_sample_once_over_the_ranks_in_equal_shares(tmp_path):
    source = mix(tmp_path, epoch_size=40)
    expected = collections.Counter(source.split("train").epoch_order(3, 0).tolist())
    seen = collections.Counter()
    for rank in range(2):
        data = loaders(source)
        data._world = lambda rank=rank: (2, rank, 1, False)
        data.setup("fit")
        sampler_rows = [row for row, _ in data.train_dataloader().sampler]
        assert len(sampler_rows) == 20  # equal shares
        seen.update(sampler_rows)
    assert seen == expected


@pytest.mark.parametrize(
    "collate, workers", [(DefaultCollate, 0), (Uint8Collate, 1)], ids=["default", "uint8-worker"]
)
def test_val_batches_carry_each_samples_part_and_the_union_of_the_parts_splits(tmp_path, collate, workers):
    """Across the process boundary too: collate=uint8's batches from a worker's shared buffers."""
    source = MixSource(
        {
            "base": {"source": folder(tmp_path, "a", per_class=10, val_fraction=0.2), "weight": 3},
            "extra": {"source": folder(tmp_path, "b", per_class=4, val_fraction=0.25)},
        }
    )
    data = loaders(source, collate=collate(), num_workers=workers)
    data.setup("fit")
    assert data.part_names("val") == ["base", "extra"]
    parts = torch.cat([batch.part for batch in data.val_dataloader()])
    assert collections.Counter(parts.tolist()) == {0: 6, 1: 3}  # every held-out sample, unweighted
    assert data.drawn() == {"base": 25, "extra": 8}  # 33 train samples an epoch, 3:1


def test_a_resume_restores_the_very_batches_and_a_changed_mixture_is_refused_by_name(tmp_path):
    """Mid-epoch: the rest of the epoch's draw, batch for batch. Another weight is another draw, whose rest
    would repeat some samples and miss others: refused like a changed seed (data.resume=lenient warns and goes
    on in the new mixture's draw)."""
    from feedline.datamodules.epoch.checks import ResumeError
    from tests.test_resume import digests, world_loaders

    tree = simple_tree(tmp_path / "tree")

    def loader(weight):
        return world_loaders(mix(tmp_path, extra={"weight": weight}), tree, 1, 4)[0]

    first = loader(0.2)
    whole = digests(loader(0.2))
    digests(first, 3)
    state = first.state_dict()
    again = loader(0.2)
    again.load_state_dict(state)
    rest = digests(again)
    assert len(rest) == len(whole) - 3
    for (image, label), (want_image, want_label) in zip(rest, whole[3:]):
        assert torch.equal(image, want_image) and torch.equal(label, want_label)
    with pytest.raises(ResumeError, match=r"train order \(.*a mix: its parts.*\)"):
        loader(0.5).load_state_dict(state)


# -- adversarial pass (attack31) -----------------------------------------------------------------------
def test_huge_or_infinite_weights_are_refused_or_shared_exactly(tmp_path):
    """An infinite weight made every count NaN, cast to -2**63; two weights of 1e308 overflowed the sum."""
    assert quotas([10, 10], [1e308, 1e308], [None, None], 100).tolist() == [50, 50]
    assert quotas([10, 10], [1e300, 1e-300], [None, None], 100).tolist() == [100, 0]
    with pytest.raises(ValueError, match=r"source.parts.extra.weight=inf: a number above 0"):
        mix(tmp_path, extra={"weight": float("inf")})


@pytest.mark.parametrize(
    ("spec", "kwargs", "said"),
    [
        ({"samples": "abc", "weight": None}, {}, r"source.parts.extra.samples='abc'"),
        ({"samples": float("inf"), "weight": None}, {}, r"source.parts.extra.samples=inf"),
        ({}, {"epoch_size": "abc"}, r"source.epoch_size='abc'"),
        ({}, {"epoch_size": float("inf")}, r"source.epoch_size=inf"),
    ],
)
def test_counts_that_are_not_numbers_are_refused_by_key(tmp_path, spec, kwargs, said):
    with pytest.raises(ValueError, match=said):
        mix(tmp_path, extra=spec, **kwargs)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"class_map": {"cat": None}}, r"source.parts.extra.class_map: cat maps to None"),
        ({"class_map": ["cat"]}, r"source.parts.extra.class_map: a mapping"),
        ({"label": ""}, r"source.parts.extra.label=''"),
    ],
)
def test_a_class_map_or_label_that_names_no_class_is_refused_by_key(tmp_path, spec, said):
    """class_map={cat: null} used to make a class named "None"; a list crashed with an AttributeError."""
    with pytest.raises(ValueError, match=said):
        _ = mix(tmp_path, extra=spec).classes


def test_an_error_naming_a_path_keeps_the_path(tmp_path):
    """Only config keys are spelled in full: a root like /data/source.v2 is not rewritten."""
    broken = {"_target_": "feedline.datasets.folder.source.FolderSource", "root": str(tmp_path / "source.v2")}
    with pytest.raises(FileNotFoundError) as err:
        MixSource({"base": {"source": folder(tmp_path, "a")}, "extra": {"source": broken}})
    assert str(tmp_path / "source.v2") in str(err.value) and "source.parts.extra.source.root" in str(
        err.value
    )


def test_the_bench_breakdown_samples_a_mix_by_its_draw_not_by_its_rows(tmp_path):
    """A small part of half the epoch is half the items bench times (it used to be sampled by rows: 12 of 312,
    so a slow small part was all but missed), and a part the epoch never draws is not timed."""
    from feedline.bench import breakdown_indices

    parts = {
        "big": {"source": folder(tmp_path, "big", per_class=100), "weight": 1},
        "small": {"source": folder(tmp_path, "small", per_class=4), "weight": 1},
        "never": {"source": folder(tmp_path, "never", per_class=4), "weight": 1e-9},
    }
    data = loaders(MixSource(parts, epoch_size=200))
    data.setup("fit")
    train = data.datasets["train"]
    got = collections.Counter(parts_of(train.records, breakdown_indices(train, 0, 100)).tolist())
    assert got[2] == 0 and 35 <= got[1] <= 65, got


def test_a_parts_test_fraction_that_holds_out_nothing_is_refused_by_key(tmp_path):
    """Alone, such a source's trainer.test is refused; in a mix it gave an empty test split, silently."""
    tiny = FolderSource(
        simple_tree(tmp_path / "tiny", per_class=4), test_fraction=0.05, cache_dir=tmp_path / "c"
    )
    source = MixSource({"base": {"source": folder(tmp_path, "a")}, "tiny": {"source": tiny}})
    source.prepare()
    with pytest.raises(ValueError, match=r"source.parts.tiny.source.test_fraction=0.05 holds out no sample"):
        source.split("test")


def test_a_part_with_an_empty_stack_of_its_own_is_not_given_the_runs(tmp_path):
    """transforms: [] is a stack of its own (no augmentation: images already at the run's size), not "use
    transforms.train": the run's RandomInvert was applied to it."""
    data = loaders(mix(tmp_path, extra={"transforms": []}))
    data.transforms.train = v2.Compose([v2.RandomInvert(p=1.0)])  # the images are the run's size already
    data.setup("fit")
    train = data.datasets["train"]
    extra_row = int(train.records.offsets[1])
    image, _ = train[extra_row]
    assert torch.equal(image, train.decode(train.records[extra_row][0], 1))


def test_a_part_transform_that_fails_to_build_is_named_by_its_key(tmp_path):
    bad = [{"_target_": "torchvision.transforms.v2.Resize", "bogus": 1}]
    with pytest.raises(TypeError, match=r"^source.parts.extra.transforms: .*bogus"):
        mix(tmp_path, extra={"transforms": bad})


def test_an_epoch_size_that_fixed_counts_alone_cannot_fill_says_so():
    """Every part with samples: the epoch is their sum exactly; "at least that" sent the user round in circles."""
    with pytest.raises(
        ValueError, match=r"source.epoch_size=150 .*every part has a fixed count.*exactly 100"
    ):
        quotas([100, 7], [None, None], [60, 40], 150)
    assert quotas([100, 7], [None, None], [60, 40], 100).tolist() == [60, 40]


def test_bench_sweep_checks_a_mix_by_its_epoch_not_its_rows(make_cfg, tmp_path, fake_clock):
    """The sweep's epochs are epoch_size samples: 60 rows passed the check while each epoch gave 8."""
    from feedline.bench import bench

    trees = [simple_tree(tmp_path / name, per_class=10) for name in ("a", "b")]
    cfg = make_cfg(
        "source=mix",
        "+source/parts@source.parts.a=folder",
        f"source.parts.a.source.root={trees[0]}",
        "+source/parts@source.parts.b=folder",
        f"source.parts.b.source.root={trees[1]}",
        "source.epoch_size=8",
        "bench.workers=sweep",
        "bench.sweep_batches=2",
        "bench.warmup=1",
        "data.batch_size=2",
        "data.num_workers=0",
        "transforms=none",
        f"bench.json_path={tmp_path / 'bench.json'}",
        config="bench",
    )
    with pytest.raises(ValueError, match=r"bench.workers=sweep needs at least .* this train split has 8"):
        bench(cfg, show=False)


@pytest.mark.parametrize(("size", "quota"), [(1000, 800), (10, 4), (7, 5), (9, 8), (12, 5), (6, 6)])
def test_an_epoch_that_straddles_two_passes_takes_no_sample_twice(size, quota):
    """A part of 1,000 read 800 an epoch took ~120 samples twice in epochs 1-3 (the end of one pass and the
    start of a fresh permutation); each pass is still a permutation, so every sample comes before any twice."""
    order = lambda seed, k: np.random.default_rng([seed, k]).permutation(size)  # noqa: E731
    epochs = 40 if size < 100 else 6
    counts = np.array([quota])
    taken = [mix_order([order], [size], [0], counts, 3, e) for e in range(epochs)]
    for e, rows in enumerate(taken):
        assert len(set(rows.tolist())) == quota, f"epoch {e}: {quota - len(set(rows.tolist()))} twice"
    run = np.concatenate(taken)
    for k in range(len(run) // size):  # each pass a permutation
        assert sorted(run[k * size : (k + 1) * size].tolist()) == list(range(size))
    again = [mix_order([order], [size], [0], counts, 3, e) for e in reversed(range(epochs))][::-1]
    assert all(np.array_equal(a, b) for a, b in zip(taken, again))  # a pure function of the epoch


def test_a_parts_stack_ending_at_another_size_is_named_before_training(tmp_path):
    bigger = [v2.Resize((12, 12), antialias=True)]
    data = loaders(mix(tmp_path, extra={"transforms": bigger}))
    with pytest.raises(
        ValueError, match=r"source.parts.extra.transforms at \(3, 12, 12\).*same crop or resize"
    ):
        data.setup("fit")


def test_a_resume_with_classes_renamed_or_mapped_otherwise_is_refused_by_name(tmp_path):
    """The same number of classes, other labels for the same samples: a swapped class_map within a part (the
    class list unchanged) or a renamed class. Checked like the seed; it passed before, labels swapped mid-run."""
    from feedline.datamodules.epoch.checks import ResumeError
    from tests.test_resume import digests, world_loaders

    tree = simple_tree(tmp_path / "tree")

    def loader(**extra):
        return world_loaders(mix(tmp_path, extra=extra), tree, 1, 4)[0]

    first = loader()
    digests(first, 2)
    state = first.state_dict()
    loader().load_state_dict(state)  # the same mix resumes
    swapped = loader(class_map={"cat": "dog", "dog": "cat"})
    with pytest.raises(ResumeError, match=r"class names \(.*\) '\w+' then, '\w+' now"):
        swapped.load_state_dict(state)
    renamed = loader(class_map={"eel": "fish"})
    with pytest.raises(ResumeError, match=r"class names"):
        renamed.load_state_dict(state)
    del state["class_names"]  # a checkpoint written before class names were recorded still resumes
    loader().load_state_dict(state)
