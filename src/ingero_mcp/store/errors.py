"""Errors a user can act on: each message says what is wrong and what to do."""


class StoreError(Exception):
    """A trace store that is missing, corrupt, of the wrong kind, or locked."""


class OutputError(StoreError):
    """A file the user asked for (a report, a timeline) that cannot be written where they asked."""
