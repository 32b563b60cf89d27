"""The timed runs behind ``bench.py``: the train loader's rate, its stages, and one model step.

    measure_loader    batches a second and samples a second of a DataLoader, after ``bench.warmup`` batches;
                      ``check_warmup`` refuses, before any batch is read, a warm-up that leaves none to time
    stage_breakdown   seconds a sample in each stage (``stages.py``), on one thread where workers would run
    model_step        seconds of one training step (forward, backward, optimizer step) on the device

Each returns plain numbers; ``verdict.py`` reads them and ``report.py`` prints them. Every duration is read
from ``clock`` (``time.perf_counter``); tests replace it with a fake one that only stages made slow on purpose
advance, so no measurement depends on the machine's load.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from feedline.diagnostics.stages import breakdown
from feedline.moved import old_names

log = logging.getLogger(__name__)

# Every duration bench measures is read from this clock (the stages' too: it is handed to stages.breakdown);
# tests replace it with one that only sleepy stages advance (tests/sleepy.py).
clock = time.perf_counter


def measure_loader(
    loader: DataLoader,
    batches: int,
    seconds: float | None = None,
    warmup: int = 2,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Iterate ``loader`` for ``batches`` batches (or ``seconds``) after ``warmup`` batches; no model."""
    check_warmup(loader, warmup)
    iterator = iter(loader)
    for _ in range(warmup):
        if next(iterator, None) is None:
            raise ValueError("the train split has fewer batches than bench.warmup: lower bench.warmup")
    samples, done, start = 0, 0, clock()
    for batch in iterator:
        samples += len(batch[1])
        done += 1
        if progress is not None:
            progress(1)
        elapsed = clock() - start
        if (seconds is None and done >= batches) or (seconds is not None and elapsed >= seconds):
            break
    elapsed = clock() - start
    if done == 0:
        raise ValueError("no batches left after the warm-up: lower bench.warmup or use more data")
    if (done < batches) if seconds is None else (elapsed < seconds):
        asked = f"bench.seconds={seconds}" if seconds is not None else f"bench.batches={batches}"
        log.warning(
            "the train split ran out after %d batch(es) (%.2f s) past the warm-up: measured those, not %s",
            done,
            elapsed,
            asked,
        )
    return {
        "samples": samples,
        "batches": done,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "batches_per_s": done / elapsed,
    }


def check_warmup(loader: DataLoader, warmup: int) -> None:
    """Before any batch is read: the warm-up leaves at least one batch of the epoch to time, or an error
    naming the batches there are and both keys that change it."""
    try:
        batches, samples = len(loader), len(loader.sampler)
    except TypeError:  # a loader without a length: found out as it runs
        return
    if warmup >= batches:
        raise ValueError(
            f"the train split has {batches} batch(es) of {loader.batch_size} ({samples} samples), and "
            f"bench.warmup={warmup} skips {warmup} before timing, which leaves none: "
            + (
                f"set bench.warmup={batches - 1} or less, or lower data.batch_size"
                if batches > 1
                else "set bench.warmup=0, or lower data.batch_size (or bench a larger split)"
            )
        )


def stage_breakdown(dataset, collate, indices: list[int], batch_size: int, workers: int = 0) -> dict:
    """Time each stage of the dataset's own pipeline (``SampleDataset.read_many``, ``decode``,
    ``augment``), in this process, on ``indices``: read (the source), decode, the per-sample transforms,
    collate and, when there are workers, ipc (moving the batch into a fresh shared-memory segment, as torch
    does for a batch not already in one; none for a collate that reuses its own shared buffers, such as
    collate=uint8); then the same items end to end. Returns seconds per sample for each stage, their
    shares, the end-to-end time, the payload size, the payload formats and the stages that ran.

    With workers, the stages run on one intra-op thread, as torch runs them in each DataLoader worker: on the
    main process's threads, a busy 2-CPU machine took 3-7 ms a sample for the crop's resize against 0.1 ms
    on one, and the crop looked like the bottleneck."""
    with _threads(1 if workers > 0 else torch.get_num_threads()):
        return breakdown(dataset, collate, indices, batch_size, workers, clock)


@contextlib.contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def model_step(
    model: torch.nn.Module, batch, device: torch.device, on_device: Callable | None, repeats: int = 5
) -> float:
    """Seconds for one training step (forward, backward, optimizer step) of ``model`` on ``batch``: the loss of
    the model's own ``training_step`` where it has one (every feedline model: a classifier, a segmenter, a
    detector alike), else the cross-entropy of ``model(x)`` against ``y``."""
    model = model.to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    if hasattr(batch, "to"):  # a Batch: every field, a detection batch's targets too
        batch = batch.to(device)
    else:
        batch = type(batch)(*(x.to(device) if isinstance(x, torch.Tensor) else x for x in batch))
    if on_device is not None:
        batch = on_device(batch)
    loss_of = _loss_of(model)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_of(batch).backward()
        optimizer.step()

    step()  # warm-up: allocations, cuDNN autotuning
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = clock()
    for _ in range(repeats):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (clock() - start) / repeats


def _loss_of(model: torch.nn.Module) -> Callable:
    """``batch -> loss``: the model's ``training_step`` (its ``self.log`` calls, made without a trainer, are
    quiet), or cross-entropy for a plain ``nn.Module`` classifier."""
    if callable(getattr(model, "training_step", None)):

        def own(batch):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # self.log without a trainer: nothing to log to
                out = model.training_step(batch, 0)
            return out["loss"] if isinstance(out, dict) else out

        return own
    return lambda batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1])


__getattr__ = old_names(__name__)  # names that moved to another module keep working for one release
