-- v9: acct_call_spans keeps only the spans that are not simply one call: every span of a thread whose calls nested
-- or overlapped, and each process's first launch of a kernel. The other spans are the thread's timed calls
-- themselves; readers read them from cuda_calls (store/sql/call_spans_kept.sql).
-- Why: at 10M events every span was one call: 82 MB of a 263 MB store (8.3 B/event) copying cuda_calls' columns.
-- A v3-v8 store keeps every span (read as it is). The version tells an older ingero-mcp, which would read the kept
-- spans as all of them, that it cannot read the store.
COMMENT ON TABLE acct_call_spans IS
    'since v9 only the spans that are not simply one call (store/sql/call_spans_kept.sql reads the others)';
