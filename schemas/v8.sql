-- v8: acct_thread_state is left empty by a finish; readers lay thread_state by its SQL over sched_intervals.
-- Why: at 10M events the stored copy took 71 MB of a 343 MB store and 1.8 s of a 9.7 s finish, and the report
-- of the whole trace reads the recorded answers (v7), not the rows; a window's report computes them (+0.04-0.09 s).
-- A v3-v7 store keeps its rows (store/views.py COMPUTED reads a non-empty table as it is). The version tells an
-- older ingero-mcp, which would read the empty table as threads that never slept, that it cannot read the store.
COMMENT ON TABLE acct_thread_state IS
    'empty since v8: the thread_state view is computed from sched_intervals (store/sql/thread_state.sql)';
