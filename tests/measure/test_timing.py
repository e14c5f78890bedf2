"""speculative/measure/timing.py: a program's timing and a measurement's derived numbers (the
measurement itself, run on a tiny model: tests/measure/test_costs.py)."""

import pytest

from speculative.measure import timing


def test_a_timing_is_its_median_repeat_and_compilation_the_first_call_over_it():
    t = timing.Timing(repeats_s=(1.0, 3.0, 2.0), first_call_s=5.0)
    assert (t.median_s, t.compile_s) == (2.0, 3.0)
    out = t.to_json()
    assert out["repeats_s"] == [1.0, 3.0, 2.0] and out["first_call_s"] == 5.0
    assert (out["median_s"], out["min_s"], out["max_s"], out["compile_s"]) == (2.0, 1.0, 3.0, 3.0)
    assert out["mean_s"] == pytest.approx(2.0)
