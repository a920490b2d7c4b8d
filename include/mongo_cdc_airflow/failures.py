"""Failures that no retry can mend: a wrong trigger param, an offset or a source config that needs
a person. They fail the task at once (``AirflowFailException``: no retries) and log their one-line
message as an error first, so it is the first error line of the task's log, above Airflow's
traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from airflow.sdk.exceptions import AirflowFailException

from mongo_cdc.capture.offsets import OffsetError
from mongo_cdc.config import SourceConfigError

log = logging.getLogger(__name__)


def fail_at_once(message: str) -> NoReturn:
    log.error("%s", message)
    raise AirflowFailException(message) from None  # the error it replaces adds nothing to the message


@contextmanager
def deterministic_failures() -> Iterator[None]:
    """Turn the errors a retry cannot change (a stored offset or config to fix) into ``fail_at_once``."""
    try:
        yield
    except (OffsetError, SourceConfigError) as exc:
        fail_at_once(str(exc))
