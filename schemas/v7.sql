-- ingero-mcp trace store, schema version 7: applied on top of v6.sql.

-- ---- wt-store-fast: the finish stores no second copy of what readers can compute cheaply (issue 20) ----------
--
-- Why: a finished 10M-event store held acct_thread_state (sched_intervals' rows again, in another shape) and
-- acct_call_spans.before_ns (a running sum of the spans' lengths): ~80 MB of ~380. Stores finished by v7 leave
-- them out; readers lay thread_state by its SQL over sched_intervals and compute before_ns by a window where it is
-- read (store/views.py). A v3-v6 store keeps both, and they are read as before. The tables and columns stay, so
-- every version's stores keep one shape; the version tells an older ingero-mcp that it cannot read these rows.
COMMENT ON TABLE acct_thread_state IS
    'v3-v6 finishes only: empty since v7 (thread_state is laid by its SQL over sched_intervals)';
COMMENT ON COLUMN acct_call_spans.before_ns IS
    'NULL since v7: the view computes it (sum of the thread''s earlier span lengths)';
