"""A chain against a block on a random T5 1.1 pair (speculative/experiments/block_costs.py): the
target step, the verify cost and each drafter's cost per round c_round at every gamma, batch 1,
with Theorem 3.8 at an assumed alpha. Costs only: random weights accept nothing meaningful.

Example (T5 1.1 base-sized: about 1.5 minutes on one H200, mostly compiling 16 programs; minutes
on 2 CPU cores):
  python scripts/block_cost_benchmark.py --target=t5_1_1_base --output_dir=/tmp/block_costs
(default output: results/random/block_costs)
"""

from absl import app, flags

from speculative.experiments import block_costs
from speculative.runs import config as config_lib

_DEFAULT = block_costs.BlockCostSettings()
_OUT = flags.DEFINE_string("output_dir", _DEFAULT.output_dir, "Where to write.")
_TARGET = flags.DEFINE_string("target", _DEFAULT.target, "A T5 1.1 preset (random weights).")
_GAMMAS = flags.DEFINE_list("gammas", [str(g) for g in _DEFAULT.gammas], "Gammas to time.")
_ALPHA = flags.DEFINE_float("alpha", _DEFAULT.alpha,
                            "ASSUMED acceptance rate for Theorem 3.8 (not measured).")
_EMB = flags.DEFINE_integer("draft_emb_dim", _DEFAULT.draft_emb_dim, "The draft's width.")
_HOT = flags.DEFINE_integer("hot_vocab", _DEFAULT.hot_vocab,
                            "Ids the draft's output layer covers (0 = the whole vocabulary).")
_INPUT = flags.DEFINE_integer("input_length", _DEFAULT.input_length, "Random source tokens.")
_DECODE = flags.DEFINE_integer("max_decode_len", _DEFAULT.max_decode_len,
                               "Decode length the states are sized for.")
_STEPS = flags.DEFINE_integer("round_steps", _DEFAULT.round_steps, "Proposals per timed call.")
_REPEATS = flags.DEFINE_integer("repeats", _DEFAULT.repeats, "Interleaved timing rounds.")
_DTYPE = flags.DEFINE_string("dtype", _DEFAULT.dtype, "Both models' dtype.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an earlier block_costs.json.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    gammas = tuple(config_lib.flag_numbers(_GAMMAS.value, "gammas", int))
    settings = block_costs.BlockCostSettings(
        target=_TARGET.value, gammas=gammas, alpha=_ALPHA.value, draft_emb_dim=_EMB.value,
        hot_vocab=_HOT.value, input_length=_INPUT.value, max_decode_len=_DECODE.value,
        round_steps=_STEPS.value, repeats=_REPEATS.value, dtype=_DTYPE.value,
        output_dir=_OUT.value)
    block_costs.run(settings, overwrite=_OVERWRITE.value)


if __name__ == "__main__":
    config_lib.run_app(main)
