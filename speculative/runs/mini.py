"""The bundled EN->DE models under the names scripts and notebooks call
(`mini.main_target()`, `mini.load(name)`, ...): a view of `speculative.bundles.ENDE`, where the
bundle and its docstring live."""

from speculative.data import bundles
from speculative.data.bundles import BUNDLE_DIR as BUNDLE_DIR
from speculative.data.bundles import FEATURE_DRAFT as FEATURE_DRAFT
from speculative.data.bundles import LARGE_TARGET as LARGE_TARGET
from speculative.data.bundles import MINI_TARGET as MINI_TARGET
from speculative.data.bundles import PREFIX as PREFIX
from speculative.data.bundles import Vocabulary as Vocabulary
from speculative.data.bundles import source_batches as source_batches
from speculative.data.bundles import test_pairs as test_pairs

MODELS_DIR = bundles.ENDE.models_dir
TARGET = bundles.ENDE.default_target
available = bundles.ENDE.available
model_card = bundles.ENDE.model_card
config = bundles.ENDE.config
load = bundles.ENDE.load
is_t5 = bundles.ENDE.is_t5
targets = bundles.ENDE.targets
main_target = bundles.ENDE.main_target
target_of = bundles.ENDE.target_of
drafts = bundles.ENDE.drafts
t5_drafts = bundles.ENDE.t5_drafts
best_draft = bundles.ENDE.best_draft
best_t5_draft = bundles.ENDE.best_t5_draft
