"""The exception types of the data layer."""
from __future__ import annotations

from sohsm.fields import FieldError


class DataError(ValueError):
    """A corpus file is missing, corrupt (checksum mismatch), unreadable or cannot be fetched.

    The message is one line that names the file and says what to do about it; the
    command line prints it as is.
    """


class DataFieldError(FieldError, DataError):
    """A :class:`DataError` whose message names a setting (``use text_mode='running'``), see :mod:`sohsm.fields`."""
