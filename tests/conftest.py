"""pytest applies this file to every room of tests/: it brings in the fixtures they share (tests/fixtures/)."""

from __future__ import annotations

from ingero_traces import ingero_dataloader, ingero_dir  # noqa: F401  (fixtures: pytest finds them here)
