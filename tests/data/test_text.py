"""Tests of speculative/training/ (the trainer, its data, objectives and runs) and of the bundled
models it trained.

Known answers: batches pad/truncate/drop as documented and hold every example once; label
smoothing and z-loss match their closed forms; a few AdamW steps lower the loss on a tiny batch;
a checkpoint written by `train` loads back with `checkpoints.load_params` and gives the logits of
the trainer's own parameters; every bundled model scores the valid-subset loss recorded in
model_card.json.
"""



from speculative.data import text
from speculative.decode import contract

EOS = contract.EOS_ID


def test_tokenizer_matches_the_mini_ende_task():
    from speculative.data import tasks

    tok = text.Tokenizer()
    vocab = tasks.mini_vocabulary()
    assert text.PREFIX == tasks.EN_DE_PREFIX and tok.vocab_size == vocab.vocab_size
    src, tgt = "Select _All", "A_lles markieren"
    assert tok.encode_inputs([src])[0] == list(vocab.encode(tasks.EN_DE_PREFIX + src)) + [EOS]
    assert tok.encode_targets([tgt])[0] == list(vocab.encode(tgt)) + [EOS]
    assert tok.decode(tok.encode_targets([tgt])[0] + [0, 0]) == tgt
