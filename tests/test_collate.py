"""Collate functions: every one returns a Batch; pad masks, uint8 layout."""

from __future__ import annotations

import pickle

import pytest
import torch

from feedline.transforms.collate import Batch, DefaultCollate, PadCollate, Uint8Collate


def _images(shapes, channels_last=False):
    out = []
    for k, (h, w) in enumerate(shapes):
        image = torch.randint(0, 256, (3, h, w), dtype=torch.uint8)
        if channels_last:
            image = image.permute(1, 2, 0).contiguous().permute(2, 0, 1)
        out.append((image, k % 3))
    return out


@pytest.mark.parametrize("channels_last", [False, True])
def test_uint8_collate_stacks_exactly(channels_last):
    samples = _images([(8, 6)] * 5, channels_last)
    batch = Uint8Collate()(samples)
    assert isinstance(batch, Batch) and batch.image.dtype == torch.uint8 and batch.valid is None
    assert torch.equal(batch.image, torch.stack([s[0] for s in samples]))
    assert batch.label.tolist() == [0, 1, 2, 0, 1]
    assert batch.image.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_uint8_collate_names_mismatched_sizes():
    with pytest.raises(RuntimeError, match=r"shapes \(3, 8, 6\) and \(3, 9, 6\).*collate=pad"):
        Uint8Collate()(_images([(8, 6), (9, 6)]))


def test_pad_masks_cover_exactly_the_image():
    samples = _images([(5, 7), (9, 3), (6, 6)])
    batch = PadCollate(pad_value=0)(samples)
    assert batch.image.shape == (3, 3, 9, 7) and batch.valid.shape == (3, 9, 7)
    for k, (image, _) in enumerate(samples):
        h, w = image.shape[1:]
        assert batch.valid[k].sum() == h * w
        assert batch.valid[k, :h, :w].all()
        assert torch.equal(batch.image[k, :, :h, :w], image)
        assert (batch.image[k][:, ~batch.valid[k]] == 0).all()


def test_pad_rounds_up_to_a_multiple():
    batch = PadCollate(multiple_of=8)(_images([(5, 7), (9, 3)]))
    assert batch.image.shape[-2:] == (16, 8)
    assert not batch.valid[:, 9:, :].any() and not batch.valid[:, :, 7:].any()


def test_pad_sequences_through_pad_sequence():
    seqs = [(torch.arange(1, n + 1), n % 2) for n in (3, 1, 4)]
    batch = PadCollate(pad_value=-1)(seqs)
    assert batch.image.tolist() == [[1, 2, 3, -1], [1, -1, -1, -1], [1, 2, 3, 4]]
    assert batch.valid.tolist() == [[True, True, True, False], [True, False, False, False], [True] * 4]


def test_collates_pickle_for_spawn_workers():
    for c in (DefaultCollate(), Uint8Collate(), PadCollate()):
        assert type(pickle.loads(pickle.dumps(c))) is type(c)


class _Numbered(torch.utils.data.Dataset):
    """Image i is filled with i % 251, channels-last, so a batch can be checked against its labels."""

    def __len__(self):
        return 96

    def __getitem__(self, i):
        return torch.full((4, 4, 3), i % 251, dtype=torch.uint8).permute(2, 0, 1), i


def _segments_and_check(collate, keep: bool, epochs: int = 3):
    """Run 2 workers for ``epochs``; return how many distinct shared segments the batches came in,
    the batch count, and whether every batch (including all kept ones, checked at the end) was intact."""
    from torch.multiprocessing.reductions import fd_id

    loader = torch.utils.data.DataLoader(
        _Numbered(), batch_size=8, num_workers=2, collate_fn=collate, persistent_workers=True, timeout=30
    )
    segments, kept, count, intact = set(), [], 0, True
    for _ in range(epochs):
        for batch in loader:
            assert type(batch) is Batch  # the pooled form never reaches the user
            fd, _ = batch.image.untyped_storage()._share_fd_cpu_()
            segments.add(fd_id(fd))
            intact &= torch.equal(batch.image[:, 0, 0, 0], (batch.label % 251).to(torch.uint8))
            # labels arrive as their own small tensor: keeping them does not keep the image segment
            intact &= batch.label.untyped_storage().data_ptr() != batch.image.untyped_storage().data_ptr()
            count += 1
            if keep:
                kept.append(batch)
    for batch in kept:
        intact &= torch.equal(
            batch.image[:, :, 1, 1], (batch.label % 251).to(torch.uint8)[:, None].expand(-1, 3)
        )
    return len(segments), count, intact


def test_uint8_workers_reuse_a_segment_once_the_main_process_frees_it():
    segments, batches, intact = _segments_and_check(Uint8Collate(), keep=False)
    assert intact and batches == 36 and segments <= 2 * 8 and segments < batches / 2


def test_uint8_workers_never_reuse_a_segment_that_is_still_held():
    segments, batches, intact = _segments_and_check(Uint8Collate(), keep=True)
    assert intact and segments == batches  # every kept batch kept its own memory


def test_uint8_without_buffer_reuse_gives_every_batch_its_own_segment():
    segments, batches, intact = _segments_and_check(Uint8Collate(reuse_buffers=False), keep=False)
    assert intact and segments == batches


def test_a_pooled_batch_changed_in_the_worker_still_crosses_intact():
    """A collate that wraps collate=uint8 and edits the batch (``replace``) in the worker: the batch
    arrives whole, as a plain Batch; only its segment is not reused."""

    class Relabel(Uint8Collate):
        def __call__(self, samples):
            batch = super().__call__(samples)
            return batch.replace(label=batch.label + 1000)

    # timeout: a batch that cannot be pickled is lost in the worker's queue thread, and the loader would wait
    loader = torch.utils.data.DataLoader(
        _Numbered(), batch_size=8, num_workers=2, collate_fn=Relabel(), timeout=30
    )
    seen = []
    for batch in loader:
        assert type(batch) is Batch
        assert torch.equal(batch.image[:, 0, 0, 0], ((batch.label - 1000) % 251).to(torch.uint8))
        seen += batch.label.tolist()
    assert sorted(seen) == [i + 1000 for i in range(96)]


def test_a_batch_fetched_under_inference_mode_frees_its_slot_outside_it(monkeypatch):
    """Lightning's predict and validation loops fetch batches inside torch.inference_mode; a batch freed
    after it (a prediction kept to the end) still gives its slot back, without an error at exit."""
    import gc
    import sys

    raised = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: raised.append(info.exc_value))
    loader = torch.utils.data.DataLoader(
        _Numbered(),
        batch_size=8,
        num_workers=1,
        collate_fn=Uint8Collate(),
        persistent_workers=True,
        timeout=30,
    )
    with torch.inference_mode():
        kept = list(loader)
    del kept
    gc.collect()
    assert not raised, raised
