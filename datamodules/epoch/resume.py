"""Mid-epoch resume: the train loader's position is part of the checkpoint, and restoring it costs O(1).

The train order of an epoch is a pure function of (seed, epoch), and each rank reads every
``world_size``-th entry of it (``order.py``). So the samples consumed after k batches of B on W ranks are the
order's first k*B*W entries, whatever the world: a position is the epoch and that count, and resuming is
slicing the order, with no sample read, decoded or even listed on the way. A resume on another world size or
batch size (elastic) reads the rest of the epoch split over the new world, each sample once; Lightning's
count of the epoch's batches is moved to match (``shift``), so the epoch ends when its samples do.

Each index travels with a seed of its own, a function of (seed, epoch, index): ``SampleDataset`` seeds torch's
generator with it before the per-sample transforms, so a sample's augmentation does not depend on which
worker, rank or batch drew it, or on whether the run was interrupted. The batch-level mix on the device is
seeded per batch, from (seed, epoch, batch, rank): after an elastic resume its batches are other batches.

Lightning saves ``ResumableLoader.state_dict()`` with the checkpoint and hands it back through
``load_state_dict`` before the first ``iter()`` of a fit that resumes inside an epoch (its stateful-loader
interface); at an epoch boundary it hands nothing, and the datamodule's copy of the state (``image.py``) is
checked instead. Whether a state fits the run is decided in ``datamodules/epoch/checks.py``.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

from torch.utils.data import DataLoader

from feedline.datamodules.epoch.checks import (
    STATE_FORMAT,
    ResumeError,
    check_resume_mode,
    missing_state,
    other_order_rule,
    state_problems,
)
from feedline.datamodules.epoch.order import Segment, rank_batches
from feedline.datamodules.epoch.sampler import EpochSampler

log = logging.getLogger(__name__)


def _weakly(method):
    """A bound method held by a weak reference to its object (a plain function as it is); None stays None."""
    if method is None or not hasattr(method, "__self__"):
        return (lambda: method) if method is not None else None
    return weakref.WeakMethod(method)


def _raise(error: Exception):
    raise error
    yield  # a generator: it raises when first asked for a batch


@dataclass
class Resuming:
    """What the first train loader of a fit resumed from ``checkpoint`` checks at its first ``iter()`` when
    Lightning handed it no state: ``lightning_hands``, whether it should have (it restarts inside an epoch),
    and ``state``, the copy the datamodule keeps in the checkpoint (None: there is none)."""

    checkpoint: str
    lightning_hands: bool
    state: dict | None


class ResumableLoader(DataLoader):
    """The train loader, with Lightning's stateful-loader interface: its state is this rank's position and
    what that position means (``resume_checks.CHECKED``: the samples, the train split, the batch size, the
    world size and the seed it counts in).

    ``progress``: () -> (epoch, batches) Lightning goes on from, or None without a fitting Trainer.
    ``shift``: (batches) -> None moves Lightning's count of the epoch's batches by that many (a resume on
    another world or batch size: the rest of the epoch is another number of batches), or None.
    ``resuming``: for the first train loader of a fit resumed from a checkpoint, a ``Resuming``; Lightning
    hands the state to ``load_state_dict`` before the first ``iter()`` only when it restarts inside an
    epoch, so that ``iter()`` checks what Lightning did not hand."""

    def __init__(
        self,
        dataset,
        *,
        sampler: EpochSampler,
        checks: dict,
        mode: str,
        progress=None,
        shift=None,
        resuming: Resuming | None = None,
        **kwargs,
    ):
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.position = sampler.position
        self.checks = dict(checks)
        self.mode = check_resume_mode(mode)
        # the datamodule's methods, held weakly: a datamodule holds its train loader, and a cycle between them
        # would leave the loader (and its persistent workers) to the cyclic garbage collector, where the
        # iterator's shutdown waits out torch's 5 s join timeout per worker
        self._progress = _weakly(progress)
        self._shift = _weakly(shift)
        self.resuming = resuming

    @property
    def progress(self):
        return self._progress() if self._progress is not None else None

    @property
    def shift(self):
        return self._shift() if self._shift is not None else None

    def state_dict(self) -> dict:
        """Where training goes on from: under a Trainer, where Lightning's progress counters say it goes on
        (``lightning_position``: whether the checkpoint was taken after a step or inside one, as SLURM's
        signal handler does, or at an epoch's end); else this loader's own position."""
        where = self.progress() if self.progress is not None else None
        epoch, batches = where if where is not None else (self.position.epoch, self.position.batches)
        segment = self._segment(epoch)
        return {
            "format": STATE_FORMAT,
            "epoch": epoch,
            "batches": batches,
            "consumed": segment.consumed(batches, self.sampler.size),
            "segment": [segment.start, segment.base],  # consumed follows from batches: checked on load
            **self.checks,
        }

    def _segment(self, epoch: int) -> Segment:
        """The part of ``epoch``'s order this loader reads: the resumed segment in the epoch it resumed,
        else the whole epoch."""
        p = self.position
        start, base = (p.start, p.base) if epoch == p.epoch else (0, 0)
        return Segment(epoch, start, base, self.sampler.num_replicas, self.batch_size)

    def load_state_dict(self, state: dict) -> None:
        self.resuming = None  # handed a state: nothing is missing
        lightning = self.progress() if self.progress is not None else None
        position, problems = state_problems(state, self.checks, lightning)
        consumed = position[2] if position is not None and not problems else None
        skip = position is not None and other_order_rule(state, self.checks, position) is not None
        if skip:  # another rule's epoch: none of its rest is known in this order; the next epoch is whole
            consumed = self.sampler.size
        if (
            consumed is not None
            and not skip
            and any(state.get(k) != self.checks.get(k) for k in ("world_size", "batch_size"))
        ):
            log.info(
                "the train loader resumes epoch %d on %d rank(s), batches of %d per rank (the checkpoint's: %s "
                "rank(s), batches of %s), after %d of its %d samples: the rest is split over this world, each "
                "sample once",
                position[0],
                self.checks["world_size"],
                self.checks["batch_size"],
                state.get("world_size"),
                state.get("batch_size"),
                consumed,
                self.sampler.size,
            )
        self._settle(problems, lightning or (position[:2] if position else None), consumed, skip)

    def __iter__(self):
        resuming, self.resuming = self.resuming, None
        if resuming is not None:  # the first iter() of a resumed fit, and Lightning handed no state
            try:
                if resuming.lightning_hands or resuming.state is None:
                    self._settle([missing_state(resuming.checkpoint)], self.progress())
                else:  # an epoch boundary, where Lightning hands none: the datamodule's copy is checked
                    self.load_state_dict(resuming.state)
            except ResumeError as err:
                # Raised by the first next(): Lightning's teardown fails on a loader whose iter() failed.
                return _raise(err)
        return super().__iter__()

    def _settle(
        self,
        problems: list[str],
        position: tuple[int, int] | None,
        consumed: int | None = None,
        skip: bool = False,
    ) -> None:
        """Refuse (strict) or warn (lenient) about ``problems``, then go on from ``position``: Lightning's
        when a Trainer resumes, else the state's; None (an unreadable state, no Trainer): the epoch's start.
        ``consumed``: the samples of the epoch's order read before (None: ``position``'s batches of this run's
        world and batch size)."""
        if problems and self.mode == "strict":
            lenient = (
                "skip the rest of this epoch and go on at the next epoch's start"
                if skip
                else "go on where Lightning resumes, in this run's order"
            )
            raise ResumeError(
                f"cannot resume the train loader: {'; '.join(problems)}. Or set data.resume=lenient to {lenient}"
            )
        epoch, batches = position if position is not None else (self.position.epoch, 0)
        if problems and skip:
            log.warning(
                "data.resume=lenient: %s; the rest of epoch %d is skipped, training goes on at epoch %d's start",
                "; ".join(problems),
                epoch,
                epoch + 1,
            )
        elif problems:
            log.warning(
                "data.resume=lenient: %s; epoch %d goes on after batch %d in this run's order, so it may repeat "
                "or miss samples; the epochs after it are whole",
                "; ".join(problems),
                epoch,
                batches,
            )
        if consumed is None:
            consumed = Segment(epoch, 0, 0, self.sampler.num_replicas, self.batch_size).consumed(
                min(batches, len(self)), self.sampler.size
            )
        # Lightning counts the epoch's batches up to len(self): the rest of the epoch begins at len(self) minus
        # the batches it takes on this world (the batches already counted, unless the world changed). The
        # shift is from Lightning's own count, which a checkpoint of a smaller world or batch size can hold
        # past this world's len(self): moving it from a clamped count would leave it ahead, and Lightning would
        # end the epoch before its last samples.
        base = len(self) - rank_batches(self.sampler.remaining(consumed), self.batch_size, self.drop_last)
        if base != batches and self.shift is not None:
            self.shift(base - batches)
        self.sampler.set_epoch(epoch)
        p = self.position
        p.epoch, p.batches, p.start, p.base = epoch, base, min(consumed, self.sampler.size), base
        self.sampler.start = p.start
        if consumed:
            log.info("train loader resumes epoch %d at batch %d of %d", epoch, base, len(self))
