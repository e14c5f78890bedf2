"""Run-level helpers: `TINY_GIN`, gin bindings of tiny T5 configs (a 4000-piece vocabulary,
as the mini task's) for the infer, table2 and config tests."""

TINY = dict(vocab_size=4000, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
             mlp_activations=("gelu", "linear"), dropout_rate=0.0,
             relative_attention_num_buckets=8, relative_attention_max_distance=16)
TINY_GIN = "from __gin__ import dynamic_registration\nfrom speculative.models import t5\n"
TINY_GIN += "".join(
    f"{scope}/t5.T5Config:\n" + "".join(f"  {k} = {v!r}\n" for k, v in dict(
        TINY, num_encoder_layers=enc, num_decoder_layers=dec).items())
    for scope, enc, dec in (("tiny_target", 2, 2), ("tiny_draft", 1, 1),
                            # decoder-only (DECODER_ONLY = True), for the stdlib_code task
                            ("tiny_code_target", 0, 2), ("tiny_code_draft", 0, 1)))
