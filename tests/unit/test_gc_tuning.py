import gc
from collections.abc import Iterator

import pytest

from eagle3_datagen.generate.gc_tuning import YOUNG_THRESHOLD, collect_less_often, tune_for_batches


@pytest.fixture
def thresholds() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


@pytest.mark.usefixtures("thresholds")
def test_the_young_generation_is_collected_less_often_and_the_old_ones_as_before() -> None:
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    collect_less_often()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)


@pytest.mark.usefixtures("thresholds")
def test_a_higher_threshold_or_a_disabled_collector_is_left_alone() -> None:
    gc.set_threshold(100_000, 5, 5)
    collect_less_often()
    assert gc.get_threshold() == (100_000, 5, 5)
    gc.set_threshold(0, 10, 10)  # 0 turns automatic collection off
    collect_less_often()
    assert gc.get_threshold() == (0, 10, 10)


@pytest.mark.usefixtures("thresholds")
def test_what_is_alive_when_batches_start_is_frozen_and_the_young_threshold_raised() -> None:
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    loaded = [[i] for i in range(1000)]  # stands for the imports and the tokenizer
    tune_for_batches()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() >= len(loaded)  # no collection traverses them again
    gc.unfreeze()
