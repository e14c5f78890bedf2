"""speculative/data/text.py: the tokenizer matches the mini_ende task's."""



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
