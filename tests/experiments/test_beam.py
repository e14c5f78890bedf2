"""speculative/experiments/beam.py: the beam benchmark's report, and an earlier one kept."""


import pytest

from speculative.runs import mini


@pytest.mark.slow  # ~70 s: all three searches on two sentences, then 30 with two
def test_beam_benchmark_writes_its_report_and_keeps_an_earlier_one(tmp_path):
    from speculative.experiments import beam  # pylint: disable=g-import-not-at-top

    result = beam.run(str(tmp_path), mini.MINI_TARGET, num_sentences=2, beam_sizes=(2,),
                      split_sentences=30, split_batch=16)
    [row] = result["rows"]
    assert row["same_sequences"] == {"jitted": True, "speculative": True}
    split = row["test_split"]
    # test sentence 28 is longer than the input length: it is decoded in a batch of its own
    assert split["sentences"] == 30 and split["longer_than_input"] == 1
    assert split["same_beams"] and split["max_score_diff"] < 1e-4
    assert split["target_calls"]["speculative"] <= split["target_calls"]["jitted"]
    assert 0 < split["bleu"] <= 100
    assert row["jitted"]["target_calls"] == row["host"]["target_calls"]
    assert row["speculative"]["target_calls"] <= row["host"]["target_calls"]
    assert (tmp_path / "beam.md").read_text().startswith("# Beam search walltime")
    with pytest.raises(FileExistsError, match="--overwrite"):
        beam.run(str(tmp_path), mini.MINI_TARGET, num_sentences=2, beam_sizes=(2,))
