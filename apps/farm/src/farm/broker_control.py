"""The coordinator's hands on the broker: a job's queue, its consumers on the workers (Celery's
remote control), revokes, pings and the chunks' messages. No state of its own: what to do comes from
the database (farm.statemachine), and every call here may be made twice."""

from __future__ import annotations

import logging
import time

from celery import Celery

from farm.config import Settings
from farm.tasks import QUEUE_ARGS, queue_of

log = logging.getLogger("farm.broker_control")


def worker_name(node: str) -> str:
    return "farm@" + node


class BrokerControl:
    def __init__(self, s: Settings, app: Celery):
        self.s, self.app = s, app

    def declare_queue(self, jid: str) -> None:
        with self.app.connection_for_write() as conn:
            queue_of(jid)(conn.default_channel).declare()

    def delete_queue(self, jid: str) -> None:
        """Once no worker consumes it. A worker answers cancel_consumer before it acts on it; a queue
        deleted under its consumer makes the worker reconnect, and it declares the queue again."""
        q, deadline = queue_of(jid), time.monotonic() + self.s.control_timeout_s
        while True:
            try:
                with self.app.connection_for_write() as conn:
                    q(conn.default_channel).delete(if_unused=True)
                    q.exchange(conn.default_channel).delete()
                return
            except Exception:     # PRECONDITION_FAILED while a consumer is left
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def add_consumers(self, jid: str, nodes: list[str], *, reply: bool) -> list[str]:
        """add_consumer of the job's queue on the nodes' workers; with reply, the nodes that answered."""
        q = queue_of(jid).name
        answers = self.app.control.add_consumer(q, exchange=q, exchange_type="direct", routing_key=q,
                                                options={"queue_arguments": QUEUE_ARGS},
                                                destination=[worker_name(n) for n in nodes], reply=reply,
                                                timeout=self.s.control_timeout_s)
        return sorted(name.split("@", 1)[1] for a in answers or [] for name in a)

    def cancel_consumers(self, jid: str, nodes: list[str]) -> None:
        if nodes:
            self.app.control.cancel_consumer(queue_of(jid).name, destination=[worker_name(n) for n in nodes],
                                             reply=True, timeout=self.s.control_timeout_s)

    def still_running(self, ids: set[str], nodes: list[str]) -> list[str]:
        """Of these attempts, those the nodes' workers still run (inspect active). A node that does not
        answer is not rendering for us: dead, or frozen (its consumers went with its connection)."""
        if not ids or not nodes:
            return []
        active = self.app.control.inspect(destination=[worker_name(n) for n in nodes], limit=len(nodes),
                                          timeout=self.s.control_timeout_s).active() or {}
        return sorted({t["id"] for tasks in active.values() for t in tasks or []} & ids)

    def revoke(self, ids: list[str]) -> None:
        """The renders stopped (SIGTERM to the pool child: farm.proc takes its tools down too)."""
        self.app.control.revoke(ids, terminate=True, signal="SIGTERM")

    def any_alive(self, nodes: list[str]) -> bool:
        try:
            return bool(self.app.control.ping(destination=[worker_name(n) for n in nodes],
                                              timeout=self.s.control_timeout_s, limit=1))
        except Exception as e:
            log.warning("ping of %s: %s", nodes, e)
            return False

    def publish(self, attempt_id: str, jid: str, kwargs: dict, *, priority: int, limits: tuple[float, float]) -> None:
        soft, hard = limits
        self.app.send_task("farm.render", task_id=attempt_id, queue=queue_of(jid), ignore_result=True,
                           priority=priority, kwargs=kwargs, soft_time_limit=soft, time_limit=hard)
