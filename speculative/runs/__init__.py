"""Gin-configurable run functions behind `scripts/` (infer, benchmark, alpha, Table 2, train).

Library modules (`models/`, `sampling`, `decoding`, `checkpoints`, ...) know nothing of gin; the run
functions here are the edge where gin binds values (docs/design.md, "Conventions").
`config.py` parses `--gin_file` / `--gin.NAME=VALUE` flags the way T5X does; `models.py` turns a
`T5Config` plus a checkpoint path (or a draft spec) into a `DecodeModel`.
"""

import logging as _logging
import os as _os

# The scripts' start-up stays quiet: TensorFlow (imported by seqio) and its CUDA probe print at
# C++ level unless told not to, and JAX logs each accelerator backend it does not find. A user
# who wants them sets TF_CPP_MIN_LOG_LEVEL themselves.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
_logging.getLogger("jax._src.xla_bridge").setLevel(_logging.WARNING)
