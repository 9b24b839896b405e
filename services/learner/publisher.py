"""One policy publish at a time on a background thread, its failure raised on the learner's thread.

With ``--background-publish`` the learner copies a publish step's weights to CPU and hands the
write + ``PublishPolicy`` to a :class:`BackgroundPublisher` (:func:`~.persistence.publish`), so
the next step trains while they run. The rules it keeps:

- **one in flight**: :meth:`BackgroundPublisher.submit` first waits for the previous job, so
  versions are written and announced in the order they were numbered (never two at once);
- **never lost**: a job's exception is kept and raised on the learner's thread, by
  :meth:`~BackgroundPublisher.check` at the start of the next step (if the job has ended by
  then), else by :meth:`~BackgroundPublisher.wait` at the next publish, checkpoint or exit;
  ``on_failure`` runs first (the learner rolls back the version it numbered but never announced);
- **exit waits**: the thread is not a daemon, and :meth:`~BackgroundPublisher.close` joins it
  (logging, not raising, a failure while another error is already on its way out).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class BackgroundPublisher:
    """Runs publish jobs on a background thread, one at a time (see the module docstring)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._on_failure: Callable[[], None] | None = None
        self._what = ""

    @property
    def busy(self) -> bool:
        """Whether a job is still running."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, what: str, job: Callable[[], object], on_failure: Callable[[], None] | None = None) -> None:
        """Run ``job()`` on a new thread, after the previous job has ended.

        Args:
            what: the job in words, for the log (e.g. ``"policy version 7"``).
            job: writes and announces one version; whatever it raises is kept for the caller.
            on_failure: called on the caller's thread just before the job's error is raised.

        Raises:
            BaseException: the previous job's error (then ``job`` is not started).
        """
        self.wait()
        self._what, self._on_failure = what, on_failure
        self._thread = threading.Thread(target=self._run, args=(job,), name="prioreplay-publish", daemon=False)
        self._thread.start()

    def _run(self, job: Callable[[], object]) -> None:
        try:
            job()
        except BaseException as e:  # noqa: BLE001 - kept, and raised on the learner's thread
            self._error = e

    def check(self) -> None:
        """Raise the finished job's error, if any; never blocks (a running job is left running)."""
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def wait(self) -> None:
        """Block until the running job (if any) has ended; raise its error (once)."""
        if self._thread is None:
            return
        self._thread.join()
        self._thread = None
        error, self._error = self._error, None
        if error is None:
            return
        log.error("background publish of %s failed: %s", self._what, error)
        if self._on_failure is not None:
            self._on_failure()
        raise error

    def close(self) -> None:
        """Wait for the running job; log its error instead of raising it (for a way out that
        already carries an error; call :meth:`wait` first on a clean exit)."""
        try:
            self.wait()
        except BaseException:  # noqa: BLE001 - logged by wait(); another error is on its way out
            pass
