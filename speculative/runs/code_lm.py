"""The bundled decoder-only code pair under the names scripts call (`code_lm.load(name)`,
`code_lm.drafts()`, ...): a view of `speculative.data.bundles.CODE`, where the bundle and its
docstring live; its constants and `prompt_batches` are imported from `bundles` itself."""

from speculative.data import bundles

TARGET = bundles.CODE_TARGET
MAX_DECODE_LEN = bundles.CODE_MAX_DECODE_LEN
MODELS_DIR = bundles.CODE.models_dir
available = bundles.CODE.available
model_card = bundles.CODE.model_card
config = bundles.CODE.config
load = bundles.CODE.load
is_t5 = bundles.CODE.is_t5
drafts = bundles.CODE.drafts
t5_drafts = bundles.CODE.t5_drafts
target_of = bundles.CODE.target_of
best_draft = bundles.CODE.best_draft
best_t5_draft = bundles.CODE.best_t5_draft
