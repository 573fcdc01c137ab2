"""What a node's broker user may do on the farm's vhost: one user per node (README "One broker user per
node"), with RabbitMQ's configure / write / read permissions as anchored regular expressions.

A node's Celery worker declares, binds and consumes its own queue (farm.node.<node>) and its own
remote-control queue (farm@<node>.celery.pidbox, bound to the celery.pidbox fanout exchange that
carries add_consumer, cancel_consumer, ping and revoke); it answers through reply.celery.pidbox. On a
job's add_consumer it declares and consumes that job's queue (farm.job.<id>, with the exchange of the
same name), and a retry it should avoid goes back through that exchange. Its reports go to the
reports exchange, which it may write to but not read from: the reports queue is the coordinator's.
Which jobs a node serves is decided at run time, so its user may read any job's queue; it may not
read another node's queues, the reports, or anything outside these names. Each name of each right was
left out once against a real broker and the broker refused an operation the worker needs (README
"One broker user per node" says which)."""

from __future__ import annotations

import re

from farm.config import Settings

PIDBOX = "celery.pidbox"
REPLY = "reply.celery.pidbox"
JOBS = r"farm\.job\.[0-9a-f]+"          # a job's id is hex (farm.db)


def node_permissions(s: Settings, node: str) -> dict[str, str]:
    own = [re.escape("farm.node." + node), re.escape("farm@%s.%s" % (node, PIDBOX))]

    def rx(*names: str) -> str:
        return "^(%s)$" % "|".join(names)

    return {
        "configure": rx(*own, JOBS, re.escape(PIDBOX), re.escape(REPLY)),
        "write": rx(*own, JOBS, re.escape(REPLY), re.escape(s.reports_queue)),
        "read": rx(*own, JOBS, re.escape(PIDBOX)),
    }
