"""The stdio MCP server over a trace store: tools, bounded results, their text rendering and the investigate prompt."""
