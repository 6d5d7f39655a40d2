"""ingero-mcp: why a GPU job is slow when the GPU is not. eBPF traces -> DuckDB -> causal chains -> MCP."""

__version__ = "0.1.0"
