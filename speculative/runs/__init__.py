"""Gin-configurable run functions behind `scripts/` (infer, benchmark, alpha, Table 2, train).

Library modules (`models/`, `sampling`, `decoding`, `checkpoints`, ...) know nothing of gin; the run
functions here are the edge where gin binds values (docs/design.md, "Conventions").
`config.py` parses `--gin_file` / `--gin.NAME=VALUE` flags the way T5X does; `models.py` turns a
`T5Config` plus a checkpoint path (or a draft spec) into a `DecodeModel`.
"""
