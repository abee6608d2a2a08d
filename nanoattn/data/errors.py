"""The one exception type of the data layer.

A ``DataError`` is a user-facing problem (a missing or non-UTF-8 file, an empty corpus, a vocabulary
the corpus cannot support, a split too short for a window). Its message is one line that names the
file or value; it subclasses ``ValueError`` so the scripts turn every such mistake into
``error: <message>`` without a traceback.
"""


class DataError(ValueError):
    """A problem with the data or the data config, described in one line."""
