"""Health alerts pushed to webhooks (`cairn config set alert.webhooks URL[,URL...]`).

The leader compares the health checks every second with what it last saw (`changes`, pure):
a check that appears or whose severity or summary changes is an event with state "raised", one
that goes away an event with state "cleared". Detail lines are sent but do not make an event by
themselves (SLOW_DISK's figures move every second). Each event is POSTed as JSON
`{cluster, check, severity, summary, detail, state, time}` to every URL.

The same events are committed through Raft as the health history (`cairn health history`, kept
by mon/store.py). A new leader waits `LEADER_SETTLE_S` for the OSDs' heartbeats to reach it,
then starts from the checks the history says are in force, so a change of leader alone sends
nothing.

Delivery never holds the monitor up: each URL has its own bounded queue and sender task; a POST
that fails or times out (`POST_TIMEOUT_S`) is retried with doubling backoff up to `ATTEMPTS`
times, then dropped with a log line; a queue that is full drops its oldest event. Only the
leader sends. Delivery is at least once: a leader that dies after sending and before its
history entry commits leaves the next leader to send the same event again.
"""

import asyncio
import collections
import logging
import time

log = logging.getLogger("cairn.mon")

POST_TIMEOUT_S = 5.0
ATTEMPTS = 5
BACKOFF_FIRST_S = 0.5
QUEUE_EVENTS_MAX = 1000


def changes(previous, current, cluster, now):
    """The events that turn `previous` checks into `current` ones ({name: check} as in the
    `cairn health` JSON)."""
    events = []
    for name, check in sorted(current.items()):
        before = previous.get(name)
        if before is None or (before["severity"], before["summary"]) != \
                (check["severity"], check["summary"]):
            events.append({"cluster": cluster, "check": name, "severity": check["severity"],
                           "summary": check["summary"], "detail": list(check["detail"]),
                           "state": "raised", "time": now})
    for name, check in sorted(previous.items()):
        if name not in current:
            events.append({"cluster": cluster, "check": name, "severity": check["severity"],
                           "summary": check["summary"], "detail": [], "state": "cleared",
                           "time": now})
    return events


def in_force(history):
    """{name: check} of the checks whose last event in `history` (oldest first) is a raise, as
    `changes` takes them (`since`: the time of that raise)."""
    last = {}
    for event in history:
        last[event["check"]] = event
    return {name: {"severity": event["severity"], "summary": event["summary"],
                   "detail": list(event["detail"]), "since": event["time"]}
            for name, event in last.items() if event["state"] == "raised"}


class Alerter:
    """Per-URL queues and sender tasks (the asyncio shell)."""

    def __init__(self):
        self._queues = {}           # url -> deque of events
        self._wakes = {}            # url -> asyncio.Event
        self._tasks = {}            # url -> sender task
        self._session = None
        self.sent_total = 0
        self.dropped_total = 0

    def set_urls(self, urls):
        for url in [url for url in self._tasks if url not in urls]:
            self._tasks.pop(url).cancel()
            self._queues.pop(url)
            self._wakes.pop(url)
        for url in urls:
            if url not in self._tasks:
                self._queues[url] = collections.deque(maxlen=QUEUE_EVENTS_MAX)
                self._wakes[url] = asyncio.Event()
                self._tasks[url] = asyncio.get_running_loop().create_task(self._send_loop(url))

    def push(self, events):
        for url, queue in self._queues.items():
            for event in events:
                if len(queue) == queue.maxlen:
                    self.dropped_total += 1
                queue.append(event)
            self._wakes[url].set()

    async def close(self):
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()

    def _open(self):
        import aiohttp
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=POST_TIMEOUT_S))
        return self._session

    async def test(self, url, event):
        """POST `event` to `url` once, now: (True, "HTTP 200") or (False, what went wrong)."""
        import aiohttp
        try:
            async with self._open().post(url, json=event) as response:
                return response.status < 300, f"HTTP {response.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return False, f"{type(exc).__name__}: {exc}"

    async def _send_loop(self, url):
        import aiohttp
        self._open()
        queue, wake = self._queues[url], self._wakes[url]
        while True:
            if not queue:
                wake.clear()
                await wake.wait()
                continue
            event = queue[0]
            delay = BACKOFF_FIRST_S
            for attempt in range(1, ATTEMPTS + 1):
                try:
                    async with self._session.post(url, json=event) as response:
                        if response.status < 300:
                            self.sent_total += 1
                            break
                        problem = f"HTTP {response.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    problem = f"{type(exc).__name__}: {exc}"
                if attempt == ATTEMPTS:
                    log.warning("webhook %s: %s %s not delivered after %d attempts (%s)", url,
                                event["check"], event["state"], ATTEMPTS, problem)
                    self.dropped_total += 1
                    break
                await asyncio.sleep(delay)
                delay *= 2
            if queue and queue[0] is event:
                queue.popleft()


def now_s():
    return round(time.time(), 3)
