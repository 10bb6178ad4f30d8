"""`cairn audit`: who changed what, from where, when, and how it ended; refusals too.

The monitors' events (pools, config, OSD marks, keys) come from their replicated log; each OSD's
(object puts, deletes and omap changes, and refused requests) from that OSD; all are merged by
time (common/audit.py). Needs an admin key. An OSD that is down is skipped, and named.
"""

import asyncio
import json
import time

from cairn.client.admin import fail
from cairn.client.cluster import Cluster, run_loop
from cairn.client.errors import ClientError
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.common.monclient import ClusterNotFound, MonitorsUnavailable
from cairn.common.units import parse_duration

COMMANDS = ("audit",)


def add_parsers(commands, common):
    parser = commands.add_parser(
        "audit", parents=[common], help="the audit log: mutations and refusals, with who and "
        "from where", description="Every change (objects, pools, config, OSD in/out, keys) "
        "and every refused request, oldest first: time, entity, address, op, target, result. "
        "--json prints {events: [{time, entity, addr, op, target, result, source}], skipped}.")
    parser.add_argument("--since", metavar="WHEN", help="only events since WHEN: a duration ago "
                        "(90s, 15m, 2h, 1d) or a Unix time")
    parser.add_argument("--entity", metavar="NAME", help="only events of this entity, e.g. "
                        "client.alice")
    parser.add_argument("--limit", type=int, default=1000, help="the newest N (default 1000)")


def _since(text):
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return time.time() - parse_duration(text)


async def run(args):
    since = _since(args.since)
    header = {"op": "audit_read"}
    if since is not None:
        header["since"] = since
    if args.entity:
        header["entity"] = args.entity
    async with await Cluster.connect(args.cluster) as cluster:
        reply = await cluster.monc.request(header)
        events = [{**found, "source": "mon"} for found in reply.header.get("events", [])]
        skipped = []

        async def from_osd(osd_id, osd):
            try:
                connection = await cluster._connection(osd_id)
                answer = await connection.request(header, timeout_s=10)
                return [{**found, "source": f"osd.{osd_id}"}
                        for found in answer.header.get("events", [])]
            except (ConnectionClosed, RequestTimeout, RequestFailed) as exc:
                skipped.append(f"osd.{osd_id}: {exc}")
                return []
        up = {osd_id: osd for osd_id, osd in cluster.map.osds.items() if osd.get("up")}
        for found in await asyncio.gather(*(from_osd(i, o) for i, o in sorted(up.items()))):
            events += found
        skipped += [f"osd.{osd_id}: down" for osd_id, osd in cluster.map.osds.items()
                    if not osd.get("up")]
    events.sort(key=lambda found: found.get("time", 0))
    return {"events": events[-args.limit:], "skipped": skipped}


def _format(result):
    lines = []
    for found in result["events"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(found.get("time", 0)))
        lines.append(f"{when}  {found.get('entity')}  {found.get('addr')}  {found.get('op')} "
                     f"{found.get('target')}  {found.get('result')}  ({found.get('source')})")
    lines += [f"skipped {text}" for text in result["skipped"]]
    return "\n".join(lines) or "no audit events"


def main(args):
    try:
        result = run_loop(run(args))
    except (ClientError, RequestFailed) as exc:
        code = getattr(exc, "code", None) or ("permission_denied" if "permission" in str(exc)
                                              else "error")
        return fail(args, code, str(getattr(exc, "message", exc)), 1)
    except (ClusterNotFound, MonitorsUnavailable, ValueError) as exc:
        return fail(args, "unavailable", str(exc), 2)
    print(json.dumps(result) if args.json else _format(result))
    return 0
