"""Foreign HDF5 files never become silently wrong data: value scales and labels are checked at open."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest

from feedline.datasets.hdf5.source import HDF5Source


def write(path, images, labels, **attrs):
    with h5py.File(path, "w") as f:
        f["images"] = images
        f["labels"] = labels
        f.attrs.update(attrs)
    return path


def float_images(high: float, n: int = 6) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.random((n, 3, 8, 8)) * high).astype(np.float32)


def test_float_images_holding_0_to_255_are_read_as_such_with_a_warning(tmp_path, caplog):
    images = float_images(255.0)
    path = write(tmp_path / "f.h5", images, np.arange(6) % 2)
    with caplog.at_level(logging.WARNING):
        source = HDF5Source(path, val_fraction=0, cache_dir=tmp_path / "c")
    assert "source.dtype=uint8" in caplog.text and "up to" in caplog.text
    payload, _ = source.split("train")[0]
    expected = np.clip(np.rint(images[0]), 0, 255).astype(np.uint8)
    assert np.array_equal(payload, expected)  # not clipped to white


def test_float_images_in_0_to_1_are_read_quietly(tmp_path, caplog):
    images = float_images(1.0)
    path = write(tmp_path / "f.h5", images, np.arange(6) % 2)
    with caplog.at_level(logging.WARNING):
        payload, _ = HDF5Source(path, val_fraction=0, cache_dir=tmp_path / "c").split("train")[0]
    assert not caplog.text
    assert np.array_equal(payload, np.rint(images[0] * 255).astype(np.uint8))


def test_forcing_0_to_1_on_0_to_255_data_warns_about_clipping(tmp_path, caplog):
    path = write(tmp_path / "f.h5", float_images(255.0), np.arange(6) % 2)
    with caplog.at_level(logging.WARNING):
        HDF5Source(path, val_fraction=0, dtype="float32", cache_dir=tmp_path / "c")
    assert "clip" in caplog.text and "source.dtype=uint8" in caplog.text


def test_normalised_float_arrays_are_refused(tmp_path):
    path = write(tmp_path / "f.h5", float_images(2.0) - 1.0, np.arange(6) % 2)
    with pytest.raises(ValueError, match=r"source.path '.*f.h5'.*values in \[-"):
        HDF5Source(path, cache_dir=tmp_path / "c")


@pytest.mark.parametrize(
    ("labels", "attrs", "message"),
    [
        (np.array([0, 1.7, 1, 0, 1, 0]), {}, r"non-integer labels .*first: 1.7 at row 1"),
        (np.array([0, 1, -1, 0, 1, 0]), {}, r"negative labels .*first: -1 at row 2"),
        (
            np.array([0, 1, 2, 7, 1, 0]),
            {"classes": '["a", "b", "c"]'},
            r"out of range for 3 classes .*first: 7 at row 3",
        ),
    ],
    ids=["float", "negative", "out-of-range"],
)
def test_bad_labels_are_named_with_file_key_and_first_value(tmp_path, labels, attrs, message):
    path = write(tmp_path / "l.h5", np.zeros((6, 8, 8, 3), np.uint8), labels, **attrs)
    with pytest.raises(ValueError, match=message) as err:
        source = HDF5Source(path, val_fraction=0, cache_dir=tmp_path / "c")
        source.prepare()
    assert "l.h5" in str(err.value) and "labels 'labels'" in str(err.value)


def test_labels_beyond_given_class_names_are_refused(tmp_path):
    path = write(tmp_path / "l.h5", np.zeros((4, 8, 8, 3), np.uint8), np.array([0, 1, 2, 3]))
    source = HDF5Source(path, val_fraction=0, classes=["a", "b"], cache_dir=tmp_path / "c")
    with pytest.raises(ValueError, match="out of range for 2 classes"):
        source.prepare()


def test_whole_float_labels_are_accepted(tmp_path):
    path = write(tmp_path / "l.h5", np.zeros((4, 8, 8, 3), np.uint8), np.array([0.0, 1.0, 2.0, 1.0]))
    source = HDF5Source(path, val_fraction=0, cache_dir=tmp_path / "c")
    source.prepare()
    assert [source.split("train")[i][1] for i in range(4)] == [0, 1, 2, 1]


def test_16_bit_integer_images_are_scaled_from_65535(tmp_path, caplog):
    images = np.full((4, 8, 8, 3), 65535, np.uint16)
    images[0] = 32896  # about half
    path = write(tmp_path / "w.h5", images, np.arange(4) % 2)
    with caplog.at_level(logging.WARNING):
        source = HDF5Source(path, val_fraction=0, cache_dir=tmp_path / "c")
    assert "16-bit" in caplog.text
    assert int(source.split("train")[0][0].max()) == 128 and int(source.split("train")[1][0].min()) == 255


def test_nan_in_float_images_is_refused(tmp_path):
    images = float_images(1.0)
    images[3, 0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        HDF5Source(write(tmp_path / "n.h5", images, np.arange(6) % 2), cache_dir=tmp_path / "c")


@pytest.mark.parametrize("shape", [(6, 1), (6, 1, 1, 1)], ids=["N,1", "pcam"])
def test_labels_with_trailing_unit_axes_are_read_as_one_per_image(tmp_path, caplog, shape):
    labels = (np.arange(6) % 2).reshape(shape)
    path = write(tmp_path / "l.h5", np.zeros((6, 8, 8, 3), np.uint8), labels)
    for _ in range(2):  # the second run finds the label cache as the first wrote it, and trusts it
        source = HDF5Source(path, val_fraction=0.34, cache_dir=tmp_path / "c")
        with caplog.at_level(logging.WARNING):
            source.prepare()
            train = source.split("train")
        assert len(train) + len(source.split("val")) == 6 and source.classes == ["0", "1"]
        assert {train[i][1] for i in range(len(train))} == {0, 1}
    assert "damaged" not in caplog.text


def test_multi_dimensional_labels_are_refused_naming_the_key_and_shape(tmp_path):
    path = write(
        tmp_path / "l.h5", np.zeros((6, 8, 8, 3), np.uint8), np.eye(2, dtype=np.int64)[np.arange(6) % 2]
    )
    with pytest.raises(ValueError, match=r"l\.h5': labels 'labels' has shape \(6, 2\).*source\.labels_key"):
        HDF5Source(path, cache_dir=tmp_path / "c")


def test_a_label_far_past_the_rows_in_a_file_without_class_names_is_refused_not_counted_up_to(tmp_path):
    """Without a ``classes`` attribute the classes are 0..max label: one stray 2**40 would make a list of a
    trillion class names (memory exhausted, the run killed) and a model head as wide."""
    labels = np.arange(20) % 3
    labels[7] = 2**40
    path = write(tmp_path / "f.h5", np.zeros((20, 8, 8, 3), np.uint8), labels)
    with pytest.raises(ValueError, match=r"labels 'labels' holds label 1099511627776 at row 7.*20 images"):
        HDF5Source(path, cache_dir=tmp_path / "c")


def test_a_file_without_class_names_may_leave_classes_unused(tmp_path):
    """Labels 0 and 999 in ten rows (a subset of a 1000-class set): 1000 classes, as the labels say."""
    labels = np.where(np.arange(10) % 2, 999, 0)
    path = write(tmp_path / "f.h5", np.zeros((10, 8, 8, 3), np.uint8), labels)
    assert len(HDF5Source(path, val_fraction=0, cache_dir=tmp_path / "c").classes) == 1000


def group_images(f):
    f.create_group("images")["x"] = np.zeros(3)


@pytest.mark.parametrize(
    "images, said",
    [
        (group_images, r"'images' is a group, not a dataset"),
        (np.array(5), r"'images' is a scalar"),
        (np.zeros((20, 0, 8, 3), np.uint8), r"images of shape \(20, 0, 8, 3\) have an axis of size 0"),
        (np.zeros((20, 8, 8, 3), np.complex64), r"images of dtype complex64"),
    ],
    ids=["group", "scalar", "empty-axis", "complex"],
)
def test_images_that_are_no_image_array_are_refused_naming_the_key(tmp_path, images, said):
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        if callable(images):
            images(f)
        else:
            f["images"] = images
        f["labels"] = np.arange(20) % 3
    with pytest.raises(ValueError, match=rf"source.path '.*f.h5': {said}.*source.images_key"):
        HDF5Source(path, cache_dir=tmp_path / "c")
