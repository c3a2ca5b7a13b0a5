"""The one exception type for errors a user can cause and fix."""


class OpenforgeError(Exception):
    """An error with a one-line message that says what is wrong and what to do.

    The CLI prints it as `error: <message>` and exits with `exit_code`, never a traceback.
    """

    exit_code = 2
