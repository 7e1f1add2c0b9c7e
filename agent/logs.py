"""Structured logs: one JSON object per line on stderr (or plain text).

Fields beyond the message go in `extra={"fields": {...}}`:
    log.info("job registered", extra={"fields": {"job": job_id, "policy": name}})
"""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in getattr(record, "fields", {}).items())
        text = f"{stamp} {record.levelname.lower():7} {record.name}: {record.getMessage()} {extra}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text.rstrip()


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("flexcomm")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
