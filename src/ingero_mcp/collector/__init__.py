"""The eBPF collector: CUDA uprobes and kernel tracepoints (BCC), written into the trace store.

The eBPF C lives in `collectors/` (packed into the wheel as ingero_mcp/collectors); this package
loads it, discovers and attaches the CUDA libraries, drains the ring buffers and writes batches.
"""
