-- ingero-mcp trace store, schema version 7: applied on top of v6.sql.

-- == wt-explain-fast: the report's costly answers, recorded when a store is finished (issue 20) ==
--
-- Why: at 10M events most of `explain`'s time went to a few window-independent questions over
-- millions of rows (exact per-op quantiles, the per-process breakdown, launch-span medians, the
-- progress marker's candidates), asked again by every reader. When a finished store is derived
-- (analysis/derive.py store_derived), the report over the whole trace runs once on the acct_* rows
-- and the answers of its costly questions (analysis/answers.py `shared_rows`) are kept here: the
-- exact rows that each SQL text gave. A reader asking the same SQL over the same store rows reads
-- them back; any other question (another window, other pids) runs as before. Like the other acct_*
-- tables, not trace tables: never appended to, not copied into a live snapshot; empty in a store
-- migrated from an older version (nothing recorded: every question runs).
CREATE TABLE IF NOT EXISTS acct_answers (
    made_from   VARCHAR NOT NULL,  -- what the store's rows were (analysis/answers.py made_from): answers of other rows are not read
    query_key   VARCHAR NOT NULL,  -- sha256 of the SQL text and its parameters (answers.key_of)
    sql         VARCHAR NOT NULL,  -- the SQL that was run (recompute it to check an answer)
    answer      VARCHAR NOT NULL   -- its rows as JSON (answers.encode: types kept exactly, or not recorded)
);

-- ---- wt-store-fast: the finish stores no second copy of what readers can compute cheaply (issue 20) ----------
--
-- Why: a finished 10M-event store held acct_call_spans.before_ns, a running sum of the spans' lengths that nothing
-- in the analysis reads (~26 MB of ~370). Stores finished by v7 leave it NULL; readers compute it by a window where
-- it is read (store/views.py RECOMPUTED). A v3-v6 store keeps its values. The column stays, so every version's
-- stores keep one shape; the version tells an older ingero-mcp, which would read the NULLs, that it cannot.
COMMENT ON COLUMN acct_call_spans.before_ns IS
    'NULL since v7: the view computes it (sum of the thread''s earlier span lengths)';
