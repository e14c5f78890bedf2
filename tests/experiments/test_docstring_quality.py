"""speculative/experiments/docstring_quality.py: the three trivial baselines, by hand."""

from speculative.data import docstring_corpus
from speculative.experiments import docstring_quality as quality


def test_name_words_splits_snake_camel_and_dotted_names():
    assert quality.name_words("read_json") == "read json"
    assert quality.name_words("HTTPServer.serveForever") == "http server serve forever"
    assert quality.name_words("_Parser.__init__") == "parser init"
    assert quality.name_words("to_utf8") == "to utf 8"


def test_first_comment_line():
    code = 'def f(x):\n    s = "# not a comment"\n    # the first one\n    return x  # second\n'
    assert quality.first_comment(code) == "the first one"
    assert quality.first_comment("def f():\n    return 1\n") == ""
    assert quality.first_comment("def f(:\n  (") == ""  # does not tokenize: no comment


def test_most_common_docstring_and_the_baselines_rows():
    assert quality.most_common_docstring(["b", "a", "a", "b", "c"]) == "b"  # first among equals
    examples = [docstring_corpus.Example("m.py", "get_item", "def get_item(k):\n    # look up\n"
                                         "    return d[k]\n", "Return the item."),
                docstring_corpus.Example("m.py", "Size", "def Size():\n    return 1\n", "Size.")]
    rows = quality.baselines(examples, "Return it.")
    assert rows == {"name": ["get item", "size"], "comment": ["look up", ""],
                    "frequent": ["Return it.", "Return it."]}
