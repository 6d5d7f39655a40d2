"""Synthetic trace scenarios (no root, no GPU): the `demo` command and the analysis test fixtures."""

from ingero_mcp.demo.scenarios import EXPECTED, SCENARIOS, Expected, base_duration_s, generate

__all__ = ["EXPECTED", "SCENARIOS", "Expected", "base_duration_s", "generate"]
