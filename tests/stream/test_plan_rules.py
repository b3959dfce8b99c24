"""Documented plan and mix rules at their boundaries:
a unit is the shuffle window *rounded up* to whole batches, a rank's rest of *exactly* a quarter
unit is a unit of its own, and a mix without weights shares the epoch by the sources' sizes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.stream.material import mix_counts
from pipeline.stream.plan import Leg, PlanConfig, leg_sequences, unit_size


@pytest.mark.parametrize("window, batch, unit", [(150, 100, 200), (100, 100, 100), (101, 100, 200), (60, 100, 100),
                                                 (1000, 64, 1024)])
def test_a_units_samples_are_the_window_rounded_up_to_whole_batches(window: int, batch: int, unit: int) -> None:
    """README (shuffle_buffer): 'a unit: about this many, rounded up to whole batches'."""
    config = PlanConfig(7, batch, False, "pad", True, window)
    assert unit_size(10**7, config) == unit  # a long rank span: the window decides, not the 1/8 rule


@pytest.mark.parametrize("length, unit, units", [(984, 96, 11), (983, 96, 10), (120, 96, 2), (119, 96, 1)])
def test_a_rest_of_exactly_a_quarter_unit_is_a_unit_of_its_own(length: int, unit: int, units: int) -> None:
    """README: 'a rank's last unit takes a rest shorter than a quarter unit': a quarter is not
    shorter (984 = 10 * 96 + 24, and 24 == 96 / 4)."""
    config = PlanConfig(7, 16, False, "pad", True, unit)
    sequence = replace(leg_sequences(length * 8, config, [Leg(1, 0)])[0][0], length=length, unit=unit)
    assert sequence.units == units
    assert sequence.unit_range(units - 1)[1] == length


def test_a_mix_without_weights_shares_the_epoch_by_the_sources_sizes() -> None:
    """README: 'Without weights, the shares follow the sources' sizes'."""
    assert mix_counts([300, 100], [None, None], [None, None], 200) == [150, 50]
    assert mix_counts([300, 100], [None, None], [None, None], None) == [300, 100]
    assert mix_counts([300, 100, 50], [None, None, None], [None, None, 50], 250) == [150, 50, 50]
