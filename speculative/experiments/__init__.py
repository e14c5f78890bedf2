"""Reproduction reports: scripts that measure and write tables into results/. Nothing in the
library imports this package."""
