-- ingero-mcp trace store, schema version 7: applied on top of v6.sql.

-- ---- wt-store-fast: the finish stores no second copy of what readers can compute cheaply (issue 20) ----------
--
-- Why: a finished 10M-event store held acct_call_spans.before_ns, a running sum of the spans' lengths that nothing
-- in the analysis reads (~26 MB of ~370). Stores finished by v7 leave it NULL; readers compute it by a window where
-- it is read (store/views.py RECOMPUTED). A v3-v6 store keeps its values. The column stays, so every version's
-- stores keep one shape; the version tells an older ingero-mcp, which would read the NULLs, that it cannot.
COMMENT ON COLUMN acct_call_spans.before_ns IS
    'NULL since v7: the view computes it (sum of the thread''s earlier span lengths)';
