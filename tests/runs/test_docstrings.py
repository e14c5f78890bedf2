"""The bundled code -> docstring pair (Table 2's summarization task): greedy identity of every
bundled draft on the test functions, and the best draft's sampled law at T = 1 (chi-square on
the first two tokens' joint law, computed exactly from the target; a lenient verifier, which
is not exact by design, is rejected).

Greedy identity as tests/runs/test_mini.py: a row may differ only at a numerical tie.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative.data import bundles
from speculative.decode import loops as decoding
from speculative.decode.contract import EOS_ID
from speculative.decode.kernel import SamplingConfig
from tests.helpers import check_greedy_identity

DOCS = bundles.DOCSTRINGS
pytestmark = pytest.mark.skipif(not DOCS.available(), reason="no bundled docstring models")
TARGET = bundles.DOCSTRING_TARGET
DRAFTS = DOCS.drafts(TARGET) if DOCS.available() else []


def _identity(draft: str, num: int, batch_size: int):
    check_greedy_identity(DOCS.load(TARGET), DOCS.load(draft), DOCS.batches(num, batch_size),
                          DOCS.max_decode_len, gamma=4, what=draft)


def test_greedy_identity_best_draft_first_test_functions():
    _identity(DOCS.best_draft(TARGET), 16, 16)


@pytest.mark.slow  # ~1 minute a draft
@pytest.mark.parametrize("draft", DRAFTS)
def test_greedy_identity_every_draft_256_test_functions(draft):
    _identity(draft, 256, 64)


def _short_input(max_tokens: int = 32) -> np.ndarray:
    """The first test function whose source fits `max_tokens` (EOS included), `[1, max]`."""
    for [row] in DOCS.batches(None, 1):
        if np.count_nonzero(row) <= max_tokens:
            return row[None, :max_tokens]
    raise AssertionError("no short test function")


def _exact_joint(target, x, cfg) -> dict:
    """P(y1, y2) of the target at `cfg` (y2 = 0 after an EOS), over every y1 and the y2 of the
    y1 with P(y1) > 1e-4 (the rest of the mass is pooled by the test)."""
    from speculative.decode import kernel as sampling  # pylint: disable=g-import-not-at-top
    from speculative.measure import acceptance  # pylint: disable=g-import-not-at-top

    def probs(prefix):
        logits = acceptance._forced_logits(  # pylint: disable=protected-access
            target, np.repeat(x, len(prefix), 0), np.asarray(prefix, np.int32))
        return np.asarray(sampling.adjusted_probs(logits, cfg), np.float64)

    p1 = probs([[0, 0]])[0, 0]
    firsts = [int(a) for a in np.nonzero(p1 > 1e-4)[0] if a != EOS_ID]
    p2 = probs([[a, 0] for a in firsts])[:, 1]
    joint = {(EOS_ID, 0): p1[EOS_ID]}
    for a, row in zip(firsts, p2):
        joint.update({(a, b): p1[a] * row[b] for b in np.nonzero(row > 1e-6)[0]})
    return joint


def _pvalue(samples: np.ndarray, joint: dict) -> float:
    cells = [k for k, p in joint.items() if p * len(samples) >= 5]
    assert len(cells) >= 10, "law too concentrated for a meaningful test"
    index = {k: i for i, k in enumerate(cells)}
    counts = np.zeros(len(cells) + 1)
    for a, b in samples:
        counts[index.get((int(a), int(b) if a != EOS_ID else 0), len(cells))] += 1
    expected = np.array([joint[k] for k in cells] + [1.0 - sum(joint[k] for k in cells)])
    return stats.chisquare(counts, expected * len(samples) / expected.sum()).pvalue


@pytest.mark.slow  # ~1-2 minutes: 8000 two-token samples each way
def test_best_draft_keeps_the_targets_law_and_a_lenient_verifier_does_not():
    target, draft = DOCS.load(TARGET), DOCS.load(DOCS.best_draft(TARGET))
    x = _short_input()
    cfg = SamplingConfig(1.0)
    joint = _exact_joint(target, x, cfg)
    inputs = jnp.asarray(np.repeat(x, 8000, 0))

    def sample(lenience, seed):
        out = decoding.speculative_decode(target, draft, inputs, rng=jax.random.PRNGKey(seed),
                                          gamma=3, sampling=cfg, max_decode_len=2,
                                          lenience=lenience)
        return np.asarray(out.tokens)[:, :2], out.stats

    samples, exact_stats = sample(1.0, 0)
    assert int(jnp.sum(exact_stats.accepted)) > 0  # the draft's tokens were kept, not bypassed
    assert _pvalue(samples, joint) > 1e-6
    lenient, _ = sample(0.1, 1)
    assert _pvalue(lenient, joint) < 1e-6
