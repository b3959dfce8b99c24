"""The DataLoader side: ``make_loader``, and a loader whose state survives a checkpoint.

The state is where the loader stands in the plan (:mod:`.plan`): the epoch, the legs of it run
on other world sizes, and the batches delivered since, plus what the plan depends on, so that a
state that cannot be continued is refused with the setting that differs. It is the same on every
rank (every rank yields the same number of batches), so rank 0 saves it with the model.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterator, Mapping

from torch.utils.data import DataLoader

from ..caller_warning import warn_caller
from ..interrupts import held_ctrl_c
from .batching import FinishedBatches, listed, split_message
from .conversion import convert_keeping_tuples
from .dataset import ShardDataset
from .loader_state import Position, loader_state, resumed_position
from .message_buffers import Lent, ReleaseTable
from .options import check_epoch, check_loader_options, check_ranks_unchanged
from .plan import Leg
from .worker_deaths import WorkerError, exited_workers, is_worker_death, translate_worker_deaths, with_signals
from .worker_failure import WorkerFailure
from .workers import LoaderWorker, WatchedWorkersIterator, stop_workers, unit_batches

#: Why a loader takes no ``collate_fn`` (``make_loader``'s error says it too).
COLLATE_FN_NOT_TAKEN = ("a DataLoader's option: batches come collated from the workers; batch_transform= changes "
                        "each batch")


class ShardLoader(DataLoader):
    """A DataLoader over a :class:`ShardDataset` (``batch_size=None``: batches come collated
    from the workers) that counts epochs and batches.

    Iterating it plays the current epoch from where it stands, then moves to the next epoch.
    ``state_dict()`` after batch ``n`` and ``load_state_dict()`` in a fresh process make the
    next iteration yield batch ``n + 1`` onward exactly as an uninterrupted run would, with any
    ``num_workers``; on another world size (an elastic restart) the new ranks deliver exactly
    the samples the old run had not, each once, in equal numbers of batches. Continuing
    mid-epoch starts new workers (persistent ones hold a copy of the dataset from before).
    """

    #: Whether the interpreter is finalizing: a loop left under way is closed then, when this
    #: module's names may be gone (a class attribute keeps this one), and the exit handlers have
    #: already stopped the workers (multiprocessing's ends daemonic children, as workers are).
    _finalizing = staticmethod(sys.is_finalizing)
    _clock = staticmethod(time.perf_counter)  # (for a loop closed as the interpreter finalizes: see _TakenOver)

    class _TakenOver(Exception):
        """Raised in a loop over a loader that a second loop has begun over meanwhile (a class of
        the loader's: its except clause is evaluated as a loop closes, maybe as the interpreter
        finalizes, when the module's names may be gone)."""

    def __init__(self, dataset: ShardDataset, num_workers: int = 0, **kwargs: Any) -> None:
        if kwargs.get("in_order") is False:
            raise ValueError("in_order=False lets workers' batches come in any order, which no state can resume: "
                             "the loader keeps DataLoader's in-order delivery")
        if "collate_fn" in kwargs:  # (a worker's message, a unit of batches, would reach it)
            raise TypeError(f"ShardLoader() got an unexpected keyword argument 'collate_fn' ({COLLATE_FN_NOT_TAKEN})")
        check_loader_options(num_workers, kwargs.get("prefetch_factor"))
        self._released: ReleaseTable | None = None
        if num_workers:  # workers send a unit a message, and errors as messages, which this loader handles
            self._released = ReleaseTable(num_workers)
            kwargs["worker_init_fn"] = LoaderWorker(kwargs.get("worker_init_fn"), self._released)
        kwargs["collate_fn"] = convert_keeping_tuples
        if num_workers and kwargs.get("timeout"):  # a batch's, as DataLoader's; a worker sends a unit's at once
            kwargs["timeout"] = kwargs["timeout"] * unit_batches(dataset)
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        dataset.tell_idle_consumers(num_workers, loader=True)  # (here, at the user's line, not in a worker)
        self._epoch = dataset.epoch
        self._legs: list[Leg] = []  # stretches of this epoch run on other world sizes
        self._batches = 0  # batches of this rank delivered in the current stretch
        self._short_last_unit: int | None = None  # an epoch laid out as by version 3 (a checkpoint of it, loaded)
        self._workers_resumed = False  # whether persistent workers hold a plan from the middle of an epoch
        self._waited = self._stepped = 0.0  # seconds the training loop waited for batches, and ran its body
        self._generation = 0  # changed by set_epoch and load_state_dict: a loop begun before then is stale
        self._loaded = False  # whether the position is one load_state_dict set, no loop having run from it yet
        self._loops = 0  # loops begun over it: a loop that is not the last begun is stale (see __iter__)
        self._closed_early = False  # whether the last loop was closed (a break) rather than run out
        self._settled_from: tuple[int, list[Leg], int] | None = None  # the position _settle moved on from
        self._told_no_batch = False  # whether an epoch without a batch on this rank was warned of

    def __getstate__(self) -> dict[str, Any]:
        """A copy (``copy.deepcopy``, a pickle for another process) without the persistent
        workers' iterator, which is this loader's: the copy's first loop starts its own."""
        state = dict(self.__dict__)
        state["_iterator"] = None
        return state

    def _get_iterator(self) -> Any:
        """DataLoader's iterator, with workers one that checks them while it waits (see
        :class:`WatchedWorkersIterator`)."""
        if not self.num_workers:
            return super()._get_iterator()
        if not _WORKERS_CHECKED_AT_INIT:  # (else the warning of too many workers came twice)
            self.check_worker_number_rationality()
        return WatchedWorkersIterator(self)

    @property
    def epoch(self) -> int:
        self._settle()
        return self._epoch

    @property
    def generation(self) -> int:
        """Changes whenever ``set_epoch`` or ``load_state_dict`` moves the loader: a batch fetched
        ahead before then is not from where it stands."""
        return self._generation

    @property
    def loops(self) -> int:
        """Loops begun over the loader: only the last one begun goes on (see :func:`taken_over`)."""
        return self._loops

    def set_epoch(self, epoch: int) -> None:
        """Play ``epoch`` from its beginning at the next iteration; but the epoch a checkpoint
        loaded by ``load_state_dict`` stands in goes on from there, so that the usual
        ``set_epoch(e)`` before each epoch of a resumed run replays nothing. A loop under way ends
        (its next step stops it) rather than going on from where the loader no longer stands."""
        epoch = check_epoch(epoch)
        self._generation += 1
        if epoch != self._epoch and self._loaded and (not self.dataset.exact or self.batches_left()):
            where = f"epoch {self._epoch}, {self._batches} batches in" if self._legs or self._batches else \
                f"the start of epoch {self._epoch}"
            warn_caller(f"set_epoch({epoch}) leaves the position load_state_dict loaded ({where}): epoch {epoch} "
                        f"plays from its start. To go on from the checkpoint, count epochs from its epoch "
                        f"(set_epoch({self._epoch})), or leave set_epoch out")
        if epoch != self._epoch or not self._loaded:
            self._epoch, self._legs, self._batches, self._short_last_unit = epoch, [], 0, None
        self._settled_from = None

    def give_back(self, batches: int) -> None:
        """Count the last ``batches`` delivered as not delivered: the next iteration plays them
        again. For a prefetcher whose loop ended while it held batches fetched ahead: call it once
        that loop, and this loader's, have ended, and only if :attr:`generation` is what it was
        when the batches were fetched."""
        settled = batches and self._settled_from is not None  # given back from the epoch the loop took the last of
        delivered = self._settled_from[2] if settled else self._batches  # type: ignore[index]
        if not 0 <= batches <= delivered:
            raise ValueError(f"cannot give back {batches} batches: {delivered} were delivered since the "
                             f"epoch (or its last leg) began")
        if settled:
            (self._epoch, self._legs, self._batches), self._settled_from = self._settled_from, None
        self._batches -= batches

    def __len__(self) -> int:
        """This rank's batches in an epoch on this world size, those delivered included: as
        DataLoader's, and torchdata's StatefulDataLoader's after ``load_state_dict``. Frameworks
        size epochs by it: PyTorch Lightning reads it once, after loading a checkpoint, and every
        later epoch was cut to the batches left in the resumed one. An epoch resumed on fewer ranks
        runs out before ``len``, which ends it; on more, Lightning counts on from the batches the
        old ranks delivered, ends the epoch at ``len``, and the rest of it makes a short next
        epoch. :meth:`batches_left` gives those to come."""
        self._settle()
        return self.dataset.batches_left(self._epoch, [], 0)  # type: ignore[attr-defined]

    def batches_left(self) -> int:
        """Batches still to come in the current epoch on this rank."""
        self._settle()
        return self.dataset.batches_left(self._epoch, self._legs, self._batches)  # type: ignore[attr-defined]

    def _settle(self) -> None:
        """A loop that took every batch of its epoch but was closed before it ran out
        (``zip(range(len(loader)), loader)`` never asks for the batch after the last; ``islice``; a
        break after the last step) ended its epoch, as one that ran out does: the next epoch is
        where the loader stands, not an epoch with no batch left to resume. Settled only once the
        loop is over, and not before a prefetcher that stopped gives back the batches it held."""
        if self._closed_early and not self._loaded and (self._legs or self._batches) and self.dataset.exact \
                and not self.dataset.batches_left(self._epoch, self._legs, self._batches):  # type: ignore[attr-defined]
            self._closed_early = False
            self._settled_from = (self._epoch, self._legs, self._batches)  # for give_back and in_flight
            self._epoch, self._legs, self._batches = self._epoch + 1, [], 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        """A loop over the current epoch's batches (see :meth:`_loop`). A checkpoint taken after an
        epoch's last batch, once loaded, leaves that epoch nothing to yield: this loop is over as
        it is begun, and the loader stands at the next epoch, also for a loop that never asks
        for a batch (``zip(range(loader.batches_left()), loader)``, 0, starts no generator, and
        would stand there for ever)."""
        if self._loaded and (self._legs or self._batches) and self.dataset.exact \
                and not self.dataset.batches_left(self._epoch, self._legs, self._batches):  # type: ignore[attr-defined]
            self._loaded = False
            self.set_epoch(self._epoch + 1)
            return iter(())
        return self._loop()

    def _loop(self) -> Iterator[Any]:
        asked = time.perf_counter()  # the loop waits from its first ask: starting the workers is part of it
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        if not dataset.ranks_given:  # (before any worker starts)
            check_ranks_unchanged(dataset.rank, dataset.world_size)
        self._settle()
        self._closed_early = self._loaded = False
        self._settled_from = None
        self._loops += 1
        loop = self._loops
        resumed = bool(self._legs or self._batches)
        if resumed and not dataset.exact:
            raise ValueError(f"this loop would go on with epoch {self._epoch} after the {self._batches} batches an "
                             f"earlier loop took, which needs an index (shards without one are streamed whole, with "
                             f"no plan to go on from): call loader.set_epoch(...) to play an epoch from its start, or "
                             f"index the shards in place (pipeline index) so that loops and checkpoints go on exactly")
        dataset.resume(self._epoch, self._legs, self._batches, self._short_last_unit == self._epoch) if resumed \
            else dataset.set_epoch(self._epoch)
        if not resumed and dataset.exact and not len(self) and not self._told_no_batch:
            self._told_no_batch = True  # (what makes it so is the same every epoch: told once)
            warn_caller(f"no epoch has a batch for rank {dataset.rank}: {dataset.samples} samples on "
                        f"{dataset.world_size} rank(s), batch_size={dataset.batch_size}, drop_last={dataset.drop_last}, "
                        f"remainder={dataset.remainder!r}")
        if self._iterator is not None and not self._iterator.owned_here():  # a forked child's copy of the loader:
            self._iterator = None  # the workers are its parent's, for it alone to use and stop
        if self._iterator is not None and (resumed or self._workers_resumed or not all(
                w.is_alive() for w in getattr(self._iterator, "_workers", ()))):
            # persistent workers hold a copy of the dataset taken before this resume (or during
            # an earlier one, which would replay it), or one of them died
            self._stop_workers(self._iterator)
        self._workers_resumed = resumed
        if self.num_workers and self._released is not None:
            self._released.fit(self.num_workers)
        iterator = None
        try:  # cut while it starts or resets its workers, an iterator is left broken (or its workers unknown)
            with held_ctrl_c(second_at_once=True):
                iterator = super().__iter__()
        except BaseException:
            half_built = self.__dict__.pop("_starting", None)  # (cut in its __init__: see WatchedWorkersIterator)
            for started in {id(it): it for it in (iterator, self._iterator, half_built) if it is not None}.values():
                self._stop_workers(started)
            raise
        if self.num_workers:
            translate_worker_deaths()
        failure, generation = None, self._generation
        try:
            for message in iterator:
                self._waited += time.perf_counter() - asked
                if isinstance(message, WorkerFailure):
                    failure = message
                    break
                for batch in self._batches_of(message):
                    if self._loops != loop:  # (a loop in another thread took over while this one's workers ran on)
                        raise self._TakenOver
                    self._batches += 1
                    handed = time.perf_counter()
                    yield batch
                    self._stepped += time.perf_counter() - handed
                    if self._loops != loop:  # a second loop began meanwhile, and took the workers and position
                        raise self._TakenOver
                    if self._generation != generation:  # set_epoch or load_state_dict since: where this
                        self._stop_workers(iterator)  # loop stood is no longer where the loader stands
                        return
                asked = time.perf_counter()
            else:  # the ask that found the epoch's end (non-persistent workers stop in it)
                self._waited += time.perf_counter() - asked
        except self._TakenOver:  # (not a worker's death, though the second loop stopped this one's workers)
            raise taken_over() from None
        except GeneratorExit:  # the loop stopped early: a break, or an error in its body; the next one restarts
            stopped = self._clock()
            if self._loops == loop:  # (only a yield raises it: a batch was handed)
                self._stepped += stopped - handed  # the step the loop stopped in
            if not self._finalizing() and (self._loops == loop or iterator is not self._iterator):
                self._stop_workers(iterator)  # (not the persistent workers a later loop took over)
                self._waited += self._clock() - stopped  # the loop waits for its workers to stop
            self._closed_early = self._loops == loop
            raise
        except Exception as exc:
            if self._loops != loop:  # a later loop, begun in another thread, stopped the workers this one waited on
                raise taken_over() from None
            death = self._death_after(iterator, exc)
            if death is None:
                raise
            raise WorkerError(death) from exc
        except BaseException:  # a Ctrl-C as it waited for a batch: the workers may hold the rest of a reset
            self._stop_workers(iterator)  # or of a batch, which the next loop would take for its own
            raise
        if failure is not None:
            self._stop_workers(iterator)
            if self._loops != loop:  # (the workers a later loop stopped end what they made: that loop's doing)
                raise taken_over()
            failure.raise_error()
        self.set_epoch(self._epoch + 1)

    def _batches_of(self, message: Any) -> Any:
        """The batches of what the DataLoader handed over: a worker sends a unit (its columns, or
        its finished batches when transforms run); without workers each item is a batch."""
        if not self.num_workers:
            return (message,)
        if isinstance(message, Lent):
            message = self._released.watch(message)  # type: ignore[union-attr]
        if isinstance(message, FinishedBatches):
            return message
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        return (listed(batch, dataset.varied, dataset.as_tuple) for batch in split_message(message, dataset.batch_size))

    def _death_after(self, iterator: Any, exc: Exception) -> str | None:
        """Stop the workers after ``exc`` came out of the DataLoader; if a worker died, the
        message of the :class:`WorkerError` to raise. A worker that dies while it sends a batch
        can break the connection (``ConnectionResetError``) a moment before PyTorch sees it
        gone, so an unexplained error waits a little for a worker to exit. (No exception is
        kept in a local here: with its traceback, that would be a reference cycle keeping the
        DataLoader alive until a garbage collection, maybe in a forked worker.)"""
        death = _death_text(exc)
        dead: list[int] = []
        for _ in range(3):  # a death signal may still interrupt this, until the workers are unwatched
            try:
                if death is None and self.num_workers:
                    dead = exited_workers(iterator, grace=1.0)
                self._stop_workers(iterator)
                break
            except RuntimeError as late:
                death = _death_text(late)
                if death is None:
                    raise
        if death is None and dead:
            death = (f"DataLoader worker (pid(s) {', '.join(map(str, dead))}) exited unexpectedly "
                     f"({type(exc).__name__}: {exc}).")
        if death is None:
            return None
        return WorkerError.explaining(with_signals(death, iterator), self.death_context())

    def death_context(self) -> str:
        """Where the loader stood when a worker died, for its :class:`WorkerError`."""
        return f"Epoch {self._epoch} of the loader over {self.dataset.source_text} stopped after batch {self._batches}; "

    def _stop_workers(self, iterator: Any) -> None:
        """Stop the worker processes of ``iterator`` and forget them, so that the next iteration
        starts new ones (persistent workers with one of them dead would fail again)."""
        stop_workers(iterator)
        if self._iterator is iterator:
            self._iterator = None

    def stats(self) -> dict[str, float]:
        """So far, over all workers: records and pieces skipped, samples replaced, remote requests
        and retries, the seconds of each stage of the workers (see :mod:`.stats`), and of the
        training loop: ``wait_s`` waiting for the next batch, ``step_s`` running the loop's body,
        and the input-bound fraction ``wait_s / (wait_s + step_s)``."""
        out = self.dataset.stats()  # type: ignore[attr-defined]
        looped = self._waited + self._stepped
        out.update(wait_s=self._waited, step_s=self._stepped, input_bound=self._waited / looped if looped else 0.0)
        return out

    def progress(self, in_flight: int = 0) -> dict[str, int]:
        """Samples of each source the job delivered in the current epoch so far, over all ranks
        (every rank in step with this one, as under DDP) and the legs on other world sizes; the
        same on every rank. ``""`` names the one source of a loader that mixes none.
        ``in_flight``: batches fetched ahead, not yet trained on (see :meth:`state_dict`)."""
        if not self.dataset.exact:
            raise TypeError("progress() counts from the epoch's plan, which shards without an index have not: index "
                            "them in place (pipeline index)")
        position = self._position(in_flight)
        return self.dataset.delivered_per_source(position.epoch, position.legs,  # type: ignore[attr-defined]
                                                 position.batches)

    def state_dict(self, in_flight: int = 0) -> dict[str, Any]:
        """Where the loader stands: epoch, its legs on other world sizes, and the batches
        delivered since (less ``in_flight`` batches fetched ahead by a prefetcher but not yet
        trained on)."""
        return loader_state(self.dataset, self._position(in_flight))  # type: ignore[arg-type]

    def _position(self, in_flight: int) -> Position:
        """Where the loader stands, less ``in_flight`` batches fetched ahead."""
        self._settle()
        epoch, legs, batches = self._settled_from if in_flight and self._settled_from is not None else (
            self._epoch, self._legs, self._batches)  # batches in flight: of the epoch the loop took the last of
        return Position(epoch, tuple(legs), batches - in_flight, self._short_last_unit == epoch)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; refuse a state whose plan this loader cannot continue."""
        dataset: ShardDataset = self.dataset  # type: ignore[assignment]
        position = resumed_position(dataset, state)
        if position.middle:
            dataset.resume(position.epoch, position.legs, position.batches, position.short_last_unit)
        self._short_last_unit = position.epoch if position.short_last_unit and position.middle else None
        self._epoch, self._legs, self._batches = position.epoch, list(position.legs), position.batches
        self._workers_resumed = True  # persistent workers hold the dataset as it was: start new ones
        self._generation += 1  # a loop under way ends at its next step
        self._loaded = True
        self._settled_from = None


#: Whether DataLoader warns of more workers than cores when it is made (recent PyTorch), not when
#: its iterator is (this class makes that one itself).
_WORKERS_CHECKED_AT_INIT = "check_worker_number_rationality" in DataLoader.__init__.__code__.co_names


def _death_text(exc: BaseException) -> str | None:
    """PyTorch's words for a worker's death, when ``exc`` reports one (also when it reached
    us translated into a WorkerError), else ``None``."""
    if not is_worker_death(exc):
        return None
    return str(exc.__cause__ if isinstance(exc, WorkerError) and exc.__cause__ else exc).strip()


def taken_over() -> RuntimeError:
    """The error of a loop whose loader another loop took over."""
    return RuntimeError("this loader was iterated again while this loop over it ran (a second for loop, "
                        "zip(loader, loader), or one in another thread): the loops would share, and lose, the "
                        "epoch's batches; iterate a loader in one loop at a time (break out of this one first), or "
                        "make two loaders")
