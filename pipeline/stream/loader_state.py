"""A loader's checkpoint: what ``state_dict`` records, and what ``load_state_dict`` checks before it
continues one.

A state is where the loader stands in the plan (the epoch, the legs of it run on other world
sizes, the batches delivered since) plus what the plan depends on. A state that cannot be
continued is refused with the setting that differs, and one that is not a state at all (another
object saved under the key, a hand-edited one) with what is wrong with it: a position outside
the epoch would otherwise replay batches, or fail later in ``len()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ..format.numbers import is_whole
from .plan import Leg, leg_remainder, leg_sequences, rank_batches
from .shards import IndexedShards

if TYPE_CHECKING:
    from .dataset import ShardDataset

STATE_VERSION = 4
#: What the plan depends on: a checkpoint of another value cannot be continued mid-epoch. (Its
#: chunks too, ``chunk_samples``, which a resumed epoch keeps whatever the chunks now.)
_PLAN_KEYS = ("sources", "seed", "batch_size", "drop_last", "remainder", "shuffle", "shuffle_buffer", "samples")
#: Of those, what may change at an epoch boundary.
_BETWEEN_EPOCHS = ("batch_size", "drop_last", "remainder", "shuffle_buffer", "samples", "sources")
_POSITION_KEYS = ("epoch", "legs", "batches", "world_size")


@dataclass(frozen=True)
class Position:
    """Where a loader stands: ``epoch``, its ``legs`` on other world sizes, and the ``batches``
    this rank delivered since the last of them."""

    epoch: int
    legs: tuple[Leg, ...]
    batches: int
    short_last_unit: bool = False  # laid out as by version 3 and before (a checkpoint of theirs, resumed)

    @property
    def middle(self) -> bool:
        return bool(self.legs or self.batches)


def loader_state(dataset: ShardDataset, position: Position) -> dict[str, Any]:
    """The checkpoint of a loader over ``dataset`` standing at ``position``."""
    state: dict[str, Any] = {"version": STATE_VERSION, "epoch": position.epoch,
                             "legs": [[leg.world, leg.batches] for leg in position.legs],
                             "batches": position.batches, "world_size": dataset.world_size}
    if position.short_last_unit and position.middle:
        state["short_last_unit"] = True
    state.update({key: _plan_value(dataset, key) for key in _PLAN_KEYS})
    state["chunk_samples"] = _epoch_chunks(dataset, position.epoch)
    state["mix"] = dataset.sources.state(position.epoch) if dataset.sources and dataset.sources.mixed else None
    return state


def resumed_position(dataset: ShardDataset, state: Mapping[str, Any]) -> Position:
    """Where a loader over ``dataset`` goes on from ``state`` (on another world size: a new leg),
    after checking that ``state`` is a loader's state whose plan ``dataset`` can continue; a mix's
    stream positions are carried over to ``dataset``."""
    state = _upgraded(state)
    saved = _saved_position(state)
    _check_mix_kind(dataset, state)
    _check_mix_names(dataset, state)
    for key in _PLAN_KEYS:
        mine = _plan_value(dataset, key)
        if state.get(key) != mine and (saved.middle or key not in _BETWEEN_EPOCHS):
            when = "" if key not in _BETWEEN_EPOCHS else (
                " (other data may follow at an epoch boundary, not in the middle of an epoch)" if key == "sources"
                else " (it can change only at an epoch boundary: resume with the checkpoint's, and change it once "
                     "this epoch ended, at a checkpoint taken after its loop; one taken in its last step is still in "
                     "the epoch)")
            raise ValueError(f"cannot resume: {_difference(dataset, key, state.get(key), mine)}{when}")
    world = int(state["world_size"])
    if saved.middle:
        _check_inside_epoch(dataset, saved, world)
        if state["version"] == 2:  # (an upgraded state keeps the version it was written in)
            _check_version_2_padding(dataset, saved, world)
    _continue_streams(dataset, state, saved.middle)  # (last: a state refused leaves the dataset as it was)
    if saved.middle and world != dataset.world_size:  # an elastic restart: a new leg
        return Position(saved.epoch, saved.legs + ((Leg(world, saved.batches),) if saved.batches else ()), 0,
                        saved.short_last_unit)
    return saved


def _upgraded(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """A state of this version; one of version 1 taken at an epoch boundary reads as one."""
    if not isinstance(state, Mapping):
        raise TypeError(f"load_state_dict takes what the loader's state_dict() returned (a dict), not a "
                        f"{type(state).__name__}")
    if "version" not in state:  # another object's state (a model's, an optimizer's), or {}
        raise ValueError(f"load_state_dict takes what the loader's state_dict() returned; this dict is not one (it "
                         f"has no 'version'; its keys: {sorted(map(str, state))[:8]})")
    if state.get("version") == 1 and not state.get("legs"):
        return {**state, "legs": [], "batches": 0, "shuffle_buffer": None, "mix": None}
    if state.get("version") not in (2, 3, STATE_VERSION):
        raise ValueError(f"loader state version {state.get('version')!r} is not supported (this library writes "
                         f"{STATE_VERSION}; a state of version 1 resumes at an epoch boundary only, one of version 2 "
                         f"wherever its plan is this version's)")
    if state["version"] in (2, 3):  # their epochs gave each rank's rest of a unit a unit of its own
        return {**state, "short_last_unit": True}
    return state


def _saved_position(state: Mapping[str, Any]) -> Position:
    """The position ``state`` records, refused unless it is one a loader could have written."""
    missing = [key for key in _POSITION_KEYS if key not in state]
    if missing:
        raise ValueError(f"not a loader state: it lacks {missing} (give load_state_dict what the loader's "
                         f"state_dict() returned)")
    try:
        epoch, batches, world = _whole(state["epoch"]), _whole(state["batches"]), _whole(state["world_size"])
        legs = tuple(Leg(_whole(w), _whole(b)) for w, b in state["legs"])
    except (TypeError, ValueError):
        raise ValueError(f"not a loader state: epoch {state['epoch']!r}, legs {state['legs']!r}, batches "
                         f"{state['batches']!r} and world_size {state['world_size']!r} must be whole numbers "
                         f"(legs: pairs of them)") from None
    if epoch < 0 or batches < 0 or world < 1 or any(leg.world < 1 or leg.batches < 0 for leg in legs):
        raise ValueError(f"not a loader state: epoch {epoch}, legs {[[leg.world, leg.batches] for leg in legs]}, batches "
                         f"{batches} and world_size {world} cannot be negative (nor a world size 0)")
    return Position(epoch, legs, batches, bool(state.get("short_last_unit", False)) and bool(legs or batches))


def _whole(value: Any) -> int:
    """``value`` as the whole number a loader wrote, or a float holding it (a state through YAML);
    ``int()`` would take ``1.5``, ``"1"`` and ``True``."""
    if not is_whole(value) and not (isinstance(value, (float, np.floating)) and float(value).is_integer()):
        raise TypeError(f"not a whole number: {value!r}")
    return int(value)


def _check_inside_epoch(dataset: ShardDataset, saved: Position, world: int) -> None:
    """Each leg of ``saved`` delivered at most the batches its ranks had in the epoch."""
    if not dataset.exact:
        return  # refused later: shards without an index do not resume mid-epoch
    legs = [*saved.legs, Leg(world, saved.batches)]
    sequences = leg_sequences(dataset.samples, dataset.plan_config, legs)
    for leg, ranks in zip(legs, sequences):
        most = max(rank_batches(sequence, dataset.plan_config) for sequence in ranks)
        if leg.batches > most:
            raise ValueError(f"cannot resume: the checkpoint says {leg.batches} batches of epoch {saved.epoch} were "
                             f"delivered on {leg.world} rank(s), where a rank has {most} at most: it is not a state "
                             f"of this data and batch size")


def _check_version_2_padding(dataset: ShardDataset, saved: Position, world: int) -> None:
    """A state of version 2 continues mid-epoch where its plan is this version's: that version
    padded every leg under ``remainder="pad"``, also with ``drop_last`` where this one drops the
    rest instead (see :func:`~.plan.leg_remainder`), which moves the ranks' spans."""
    config = dataset.plan_config
    if not dataset.exact or not (config.drop_last and config.remainder == "pad"):
        return
    legs = [*saved.legs, Leg(world, saved.batches)]
    for leg, ranks in zip(legs, leg_sequences(dataset.samples, config, legs)):
        if leg_remainder(ranks[0].pool, leg.world, config) == "drop":
            raise ValueError(f"cannot resume: this checkpoint of epoch {saved.epoch} was taken by an earlier version "
                             f"of pipeline, which with drop_last=True and remainder='pad' padded {ranks[0].pool} "
                             f"samples on {leg.world} ranks with repeats that could stand in for real samples dropped "
                             f"with each rank's short batch; this version drops the rest instead, so the epoch's "
                             f"batches differ: go on from the epoch's start (loader.set_epoch({saved.epoch})) or the "
                             f"next epoch's (loader.set_epoch({saved.epoch + 1})), or finish this epoch with the "
                             f"earlier version")


def _check_mix_kind(dataset: ShardDataset, state: Mapping[str, Any]) -> None:
    """A checkpoint of a mix resumes a mix, one of a single source a single source."""
    mix = state.get("mix")
    mixed = bool(dataset.sources and dataset.sources.mixed)
    if (mix is None) != (not mixed):
        raise ValueError("cannot resume: the checkpoint was taken " + ("with" if mix else "without") +
                         " a mix of sources, this loader reads " + ("one source" if not mixed else "a mix"))


def _check_mix_names(dataset: ShardDataset, state: Mapping[str, Any]) -> None:
    """A mix resumes a mix of the same names in the same order (checked before the sources'
    data, which would otherwise be found to differ, position by position)."""
    mix, sources = state.get("mix"), dataset.sources
    if mix is not None and sources is not None and list(mix["names"]) != sources.names:
        raise ValueError(f"cannot resume: the checkpoint mixes sources {list(mix['names'])}, this loader "
                         f"{sources.names} (the same names, in the same order: a source's order of samples comes "
                         f"from its place in the mix); give them so, or start the new mix afresh, without "
                         f"load_state_dict (every source's stream then starts over)")


def _continue_streams(dataset: ShardDataset, state: Mapping[str, Any], middle: bool) -> None:
    """An epoch resumed in its middle keeps the chunks it began on; a mix's stream positions are
    carried over from ``state`` (its shares may change at an epoch boundary only). Every value is
    checked before any is taken: a state refused leaves the loader as it was."""
    mix, sources, epoch = state.get("mix"), dataset.sources, int(state["epoch"])
    if sources is None:
        return
    n = len(sources.chunks)
    sizes = state.get("chunk_samples")
    cut = _whole_numbers(sizes, n, 1, "chunk_samples", "a chunk size") if middle and sizes is not None else None
    if mix is not None:
        if not isinstance(mix, Mapping):
            raise ValueError(f"not a loader state: its mix {mix!r} must be a mapping (what state_dict() wrote)")
        counts = _whole_numbers(mix.get("counts"), n, 0, "mix counts", "a number of samples")
        offsets = _whole_numbers(mix.get("offsets"), n, 0, "mix offsets", "a stream position")
        began = mix.get("pass_chunks") or sizes or [c.per_chunk for c in sources.chunks]
        began = _whole_numbers(began, n, 1, "mix pass_chunks", "a chunk size")
        if middle and counts != sources.counts:
            raise ValueError(f"cannot resume: the checkpoint's epoch takes {dict(zip(sources.names, counts))} "
                             f"samples of its sources, this loader's {dict(zip(sources.names, sources.counts))}: "
                             f"weights and samples can change only at an epoch boundary")
    sources.resume_cut(epoch, cut)
    if mix is not None:
        sources.hold_passes(epoch, offsets, began)


def _whole_numbers(values: Any, count: int, least: int, name: str, what: str) -> list[int]:
    """``values`` as ``count`` whole numbers of at least ``least``, or the error naming them."""
    try:
        numbers = [_whole(v) for v in values]
    except TypeError:
        numbers = []
    if len(numbers) != count or (numbers and min(numbers) < least):
        raise ValueError(f"not a loader state: {name} {values!r} must be {what} (a whole number >= {least}) for each "
                         f"of the {count} source(s)")
    return numbers


def _difference(dataset: ShardDataset, key: str, theirs: Any, mine: Any) -> str:
    """What differs between a checkpoint's plan and this loader's, in words."""
    if key == "samples":
        return f"the checkpoint's epoch holds {theirs} samples (of all its sources), this loader's {mine}"
    if key == "sources":
        if theirs is None or mine is None:
            return (f"the checkpoint was taken on {'shards without an index' if theirs is None else 'an indexed set'}, "
                    f"this loader reads {'shards without one' if mine is None else 'an indexed set'}: resume on the "
                    f"shards the checkpoint was taken on, indexed as they were then")
        names = dataset.sources.names if dataset.sources else []
        if names == [""]:  # one source, unnamed
            where = dataset.shards.base if isinstance(dataset.shards, IndexedShards) else "the shards"
            return (f"{where} holds other data than when the checkpoint was taken (its shards' sample counts or "
                    f"sha256 differ): resume on the shards the checkpoint was taken on")
        changed = [n for n, a, b in zip(names, theirs or [], mine) if a != b] or names
        return (f"source(s) {changed} hold other data than when the checkpoint was taken (their shards' sample "
                f"counts or sha256 differ)")
    return f"the checkpoint was taken with {key}={theirs!r}, this loader has {key}={mine!r}"


def plan_values(dataset: ShardDataset) -> dict[str, Any]:
    """What the epoch plan of ``dataset`` depends on (besides the world size), a mix's shares with it."""
    plan = {key: _plan_value(dataset, key) for key in _PLAN_KEYS}
    plan["chunk_samples"] = _epoch_chunks(dataset, dataset.epoch)
    if dataset.sources is not None and dataset.sources.mixed:
        plan["mix"] = dict(zip(dataset.sources.names, dataset.sources.counts))
    return plan


def _epoch_chunks(dataset: ShardDataset, epoch: int) -> list[int] | None:
    """The chunk size of each source's passes that begin in ``epoch``."""
    return dataset.sources.epoch_chunks(epoch) if dataset.exact else None  # type: ignore[union-attr]


def _plan_value(dataset: ShardDataset, key: str) -> Any:
    if key in ("samples", "sources") and not dataset.exact:
        return None
    if key == "samples":
        return dataset.samples
    if key == "sources":
        return dataset.sources.fingerprints()  # type: ignore[union-attr]
    return getattr(dataset, key)
