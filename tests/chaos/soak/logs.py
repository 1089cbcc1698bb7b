"""What the soak does with the log records of its own process."""

from __future__ import annotations

import logging


class ErrorLog(logging.Handler):
    """Captures ERROR records and tasks that ended unexpectedly (any logger)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = f"{record.name}: {record.getMessage()}"
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        self.records.append(text[:500])


class RecordsAsText(logging.Handler):
    """Turns every record into text: the message formatted with its arguments, ``exc_info`` formatted
    into ``exc_text`` (which formatters print instead); no references to the objects logged remain.

    pytest's log capture keeps every record of a test (the soak runs in one module fixture). An exception
    logged as an argument (``informer %s: %s failed: %s``) or as exc_info holds its traceback, whose frames
    hold the replica that logged it (informer, Trainer state, journal, Service, client) until the test
    ends; in a service process the log handler formats the record and drops it. The soak checks that
    stopped replicas are freed and measures RSS, so records keep their text only. Added after ``ErrorLog``,
    which reads the exception first."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self._formatter = logging.Formatter()

    def emit(self, record: logging.LogRecord) -> None:
        if record.args:
            record.msg = record.getMessage()
            record.args = None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self._formatter.formatException(record.exc_info)
            record.exc_info = None
