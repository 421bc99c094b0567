"""The one exception type of the data layer."""
from __future__ import annotations


class DataError(ValueError):
    """A corpus file is missing, corrupt (checksum mismatch), unreadable or cannot be fetched.

    The message is one line that names the file and says what to do about it; the
    command line prints it as is.
    """
