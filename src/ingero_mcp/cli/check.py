"""`ingero-mcp check`: can this machine run the collector, and which processes use CUDA now?"""

from __future__ import annotations

import argparse
import json

EPILOG = """\
examples:
  ingero-mcp check              PASS/FAIL per requirement, with what to do
  sudo ingero-mcp check         as the collector will run (root)
  ingero-mcp check --json       the same as one JSON object

Exit status: 0 when every required check passes, 1 otherwise."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `check` subcommand."""
    parser = subparsers.add_parser(
        "check",
        help="can this machine run the collector? (kernel, BPF, BCC, headers, GPU, CUDA libraries)",
        description="Check what the collector needs (kernel, root/BPF permission, tracefs, kernel headers, "
        "BCC) and report the NVIDIA driver/GPUs and the libcudart/libcuda files running processes use.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run every check and print them."""
    from ingero_mcp.collector.preflight import blocking_failures, run_checks

    checks = run_checks()
    failed = blocking_failures(checks)
    if args.json:
        print(json.dumps({"ok": not failed, "checks": [c.as_dict() for c in checks]}, indent=2))
        return 1 if failed else 0
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != "PASS":
            print(f"{'':<4}  {'':<{width}}  -> {c.fix}")
    print("\nready to trace: sudo ingero-mcp trace --db run.duckdb" if not failed else
          f"\n{len(failed)} required check(s) failed: fix them, then `sudo ingero-mcp trace --db run.duckdb`")
    return 1 if failed else 0
