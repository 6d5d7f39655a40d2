"""`python -m ingero_mcp.cli`: the same entry point as the `ingero-mcp` script."""

import sys

from ingero_mcp.cli import main

sys.exit(main())
