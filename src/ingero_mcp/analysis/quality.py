"""Rows a trace store holds that the accounting cannot take as they are: counted by kind, never a traceback."""

from __future__ import annotations


OVERLAPS = "overlapping intervals of one thread"


def data_quality_sql(overlaps: bool = True) -> str:
    """Rows the accounting cannot take as they are: per kind, how many. Scheduler intervals that begin before the same
    thread's previous one ended, that end before they start, or whose split is negative; CUDA calls with a negative
    duration. The overlaps cost a sort of every interval (~0.3 s at 10M events): `overlaps=False` leaves them out (the
    report counts them only where the accounting had to mend something)."""
    return """
        SELECT 'intervals that end before they start' AS what, count(*) AS n FROM sched_intervals WHERE on_ns < off_ns
        UNION ALL SELECT 'intervals with a negative sleep or CPU wait', count(*) FROM sched_intervals
            WHERE sleep_ns < 0 OR cpu_wait_ns < 0 OR wakeup_ns < off_ns OR wakeup_ns > on_ns
        UNION ALL SELECT 'CUDA calls with a negative duration', count(*) FROM cuda_calls
            WHERE duration_ns < 0""" + (f"""
        UNION ALL SELECT '{OVERLAPS}', count(*) FROM (
            SELECT off_ns, lag(on_ns) OVER (PARTITION BY session_id, pid, tid ORDER BY off_ns, on_ns) AS prev_on
            FROM sched_intervals WHERE on_ns IS NOT NULL) WHERE off_ns < prev_on""" if overlaps else "")
