import sys

from ingero_mcp.cli import main

sys.exit(main())
