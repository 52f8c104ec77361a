"""Failure alerts: logged always, e-mailed where Airflow's SMTP notifications are set up."""

from __future__ import annotations

import html
import logging
import os
from typing import Any

log = logging.getLogger(__name__)


def alert_on_failure(context: dict[str, Any]) -> None:
    """on_failure_callback: tell the operator which stream failed and why."""
    ti = context.get("task_instance") or context.get("ti")
    dag_id = getattr(ti, "dag_id", "?")
    task_id = getattr(ti, "task_id", "?")
    error = context.get("exception")
    message = f"ALERT: {dag_id}.{task_id} failed: {error}"
    log.error("%s", message)
    recipients = os.environ.get("STREAMS_ALERT_EMAIL")
    if not recipients:
        return
    try:
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        # the body is HTML: the message as written (an error may hold "<" or line breaks)
        SmtpNotifier(to=recipients, subject=f"[streams] {dag_id}.{task_id} failed",
                     html_content=f"<pre>{html.escape(message, quote=False)}</pre>").notify(context)
    except Exception as exc:  # an alert must never mask the failure it reports
        log.error("could not e-mail the alert to %s: %s", recipients, exc)
