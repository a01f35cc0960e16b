"""Errors the command line turns into one line and exit status 2."""
from __future__ import annotations


class UsageError(Exception):
    """Bad input to a commprof command (one-line message, exit 2)."""
