"""The one error type compression raises for input it cannot work with.

A ``ValueError`` subclass so callers that already treat bad values as user errors (the
CLI's ``USER_ERRORS``) report it as a message naming the problem, not a traceback.
"""

from __future__ import annotations


class CompressionError(ValueError):
    """The model, its artifact or the data cannot be compressed as asked."""
