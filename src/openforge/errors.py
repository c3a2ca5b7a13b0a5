"""The one exception type for errors a user can cause and fix."""


class OpenforgeError(Exception):
    """An error with a one-line message that says what is wrong and what to do.

    The CLI prints it as `error: <message>` and exits with `exit_code`, never a traceback.
    """

    exit_code = 2


class RolloutInfraError(Exception):
    """Raised by plugin code (an environment's `prepare`, a reward) for a failure of the
    infrastructure it depends on, not of its own logic: a service that did not come up, a
    judge endpoint that is down. The attempt becomes an `infra_error` and is retried; any
    other exception from plugin code makes it a `plugin_error`, which is not."""
