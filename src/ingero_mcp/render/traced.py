"""The strings of a report that were recorded on the traced host (names, ops, hosts, paths), cleaned as the terminal
shows them: the wrapper never starts a line with one of them (render/wrap.py)."""

from __future__ import annotations

import re
from typing import Any

from ingero_mcp.analysis import Report
from ingero_mcp.render import fmt

# Fields that hold text written on the traced host (or in an imported file), wherever they sit in the report.
TRACED_KEYS = frozenset({
    "comm", "process_comm", "cmdline", "op", "api", "source", "host", "gpu_model", "gpu_driver", "kernel", "node",
    "method", "program", "table_name", "attached", "collector_flags", "collector_version",
    "cuda_runtime_version", "worst_stall_thread", "known_from", "function", "module", "file", "folded",
})
SKIP_KEYS = frozenset({"seconds", "evidence", "timeline", "sql"})  # large, and never printed outside a box
# Fields that name this project's own vocabulary (a table, an API layer, a collector source): a plain lowercase
# identifier there is ours ("processes", "driver"); any other value (a crafted store's) is protected like a name.
IDENTIFIER_KEYS = frozenset({"table_name", "api", "source"})
IDENTIFIER = re.compile(r"[a-z][a-z0-9_]*")
NAME_CAP = 400


def _collect(value: Any, traced: bool, out: set[str]) -> None:
    """Add to `out` every string under a traced key (or under `traced`) inside a dumped model."""
    if isinstance(value, str):
        if traced:
            out.add(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            if key in SKIP_KEYS or (key in IDENTIFIER_KEYS and isinstance(item, str) and IDENTIFIER.fullmatch(item)):
                continue
            _collect(item, traced or key in TRACED_KEYS, out)
    elif isinstance(value, list):
        for item in value:
            _collect(item, traced, out)


def traced_names(report: Report) -> list[str]:
    """Every traced string of the report, cleaned (as printed) and stripped, longest first."""
    raw: set[str] = set()
    data = report.model_dump(mode="python", exclude={"accounting": {"threads": {"__all__": {"seconds"}}}})
    chains = data.pop("chains", [])
    _collect(data, False, raw)
    for chain in chains:  # our chains' words are the analysis's own; an imported chain's op, id and texts are not
        if chain.get("origin") != "ingero-mcp":
            _collect({k: v for k, v in chain.items() if k not in SKIP_KEYS}, True, raw)
        _collect(chain.get("culprits", []), False, raw)
        _collect(chain.get("frames") or {}, False, raw)  # the code behind a finding: its frames are traced text
    cleaned = {fmt.clean(s, NAME_CAP).strip() for s in raw}
    return sorted((c for c in cleaned if len(c) >= 2), key=len, reverse=True)
