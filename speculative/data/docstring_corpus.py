"""The code -> docstring corpus: Python functions and the docstrings written for them.

Table 2's summarization task, offline: the input is a function's source with its docstring
removed, the output is that docstring (`inspect.cleandoc`-ed, whole paragraphs). Like CNN/DM
the input is long, the output a few sentences, and some of the output (names) is copied from
the input. `scripts/build_docstring_corpus.py` builds it from the standard library and a pinned
list of wheels; a corpus directory (the bundled one is `speculative/data/docstrings/`) holds:

    train.jsonl, valid.jsonl, test.jsonl   one example per line: {"path": "numpy/lib/_npyio.py",
                                            "name": "loadtxt", "code": ..., "docstring": ...}
    spm.model                               a SentencePiece vocabulary that round-trips code
                                            and prose exactly ("\\n" a piece; byte fallback)
    manifest.json                           sources and versions, counts, sha256 of every file

The repository commits valid, test, the vocabulary and the manifest; train.jsonl is rebuilt by
the script (the wheels are fetched by exact version and checked by sha256).

Pure Python (ast, tokenize), so the builder, the trainer and the seqio task share it.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import textwrap
import tokenize
from typing import Iterator, List, NamedTuple, Optional, Sequence, Tuple

from speculative import files
from speculative.data import code_corpus
from speculative.data.code_corpus import SPLITS, split_file  # noqa: F401  (the same splits)

DOCSTRING_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "docstrings")
SPM_MODEL = "spm.model"
MANIFEST = "manifest.json"
MIN_WORDS = 5  # a docstring of fewer words says too little to summarise a function


class Example(NamedTuple):
    path: str  # '<source>/<path in it>', '/'-separated: 'stdlib/json/decoder.py'
    name: str  # the function's qualified name in its file: 'JSONDecoder.decode'
    code: str  # the function's source (decorators included), docstring removed, dedented
    docstring: str  # inspect.cleandoc-ed


class Skip(NamedTuple):
    """A function with a docstring that is not an example, and why (counted in the manifest)."""
    reason: str  # 'short_docstring', 'inline_docstring', 'no_body'


def _docstring_node(node) -> Optional[ast.Expr]:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0]
    return None


def _functions(tree: ast.AST) -> Iterator[Tuple[str, ast.AST]]:
    """(qualified name, node) of every function and method in `tree`, in source order."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                yield from walk(child, name + ".")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def extract(path: str, source: str) -> Iterator[Example | Skip]:
    """Every function of one file that has a docstring: an `Example`, or a `Skip` saying why not.

    Raises SyntaxError (and ValueError for null bytes) where the file does not parse.
    """
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for name, node in _functions(tree):
        doc_node = _docstring_node(node)
        if doc_node is None:
            continue
        docstring = ast.get_docstring(node, clean=True) or ""
        if len(docstring.split()) < MIN_WORDS:
            yield Skip("short_docstring")
            continue
        if len(node.body) == 1:
            yield Skip("no_body")  # nothing but the docstring (abstract methods, stubs)
            continue
        first, last = doc_node.lineno, doc_node.end_lineno  # 1-based, inclusive
        before = lines[first - 1][:doc_node.col_offset]
        after = lines[last - 1].encode("utf-8")[doc_node.end_col_offset:].decode("utf-8")
        if before.strip() or (after.strip() and not after.strip().startswith("#")) \
                or node.body[1].lineno <= last:
            yield Skip("inline_docstring")  # shares a line with code: no clean cut
            continue
        start = min([node.lineno] + [d.lineno for d in node.decorator_list])
        code = "".join(lines[start - 1:first - 1] + lines[last:node.end_lineno])
        code = textwrap.dedent(code).rstrip() + "\n"
        yield Example(path, name, code, docstring)


def normalised_code(code: str) -> str:
    """`code`'s tokens without comments, blank lines or layout: the key of near-duplicates
    (vendored copies, reformatted overloads). Falls back to whitespace-split words where the
    snippet does not tokenize."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    try:
        return " ".join(t.string for t in tokenize.generate_tokens(io.StringIO(code).readline)
                        if t.type not in skip)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return " ".join(code.split())


def code_hash(code: str) -> str:
    return hashlib.sha256(normalised_code(code).encode("utf-8")).hexdigest()


def cut_paragraphs(docstring: str, fits) -> Tuple[Optional[str], int]:
    """The longest run of whole leading paragraphs of `docstring` for which `fits(text)` holds
    -> (text or None when not even the first paragraph fits, paragraphs dropped)."""
    paragraphs = docstring.split("\n\n")
    for keep in range(len(paragraphs), 0, -1):
        text = "\n\n".join(paragraphs[:keep]).rstrip()
        if fits(text):
            return text, len(paragraphs) - keep
    return None, len(paragraphs)


# ---------------------------------------------------------------------------------- split files

BUILDER = "scripts/build_docstring_corpus.py"


def corpus_file(data_dir: str, name: str) -> str:
    """`data_dir/name`, or FileNotFoundError with the command that builds it."""
    return code_corpus.corpus_file(data_dir, name, BUILDER, " (it fetches the pinned wheels by "
                                   "exact version and sha256)")


def read_examples(path: str) -> List[Example]:
    """The examples of one split file, in file order."""
    return code_corpus.read_records(path, Example._fields, Example, BUILDER)


def read_split(data_dir: str, split: str) -> List[Example]:
    return read_examples(corpus_file(data_dir, split_file(split)))


def write_examples(path: str, examples: Sequence[Example]) -> None:
    """One JSON object per line (non-ASCII kept as UTF-8), written atomically."""
    files.write_atomic(path, "".join(json.dumps(e._asdict(), ensure_ascii=False) + "\n"
                                     for e in examples))
