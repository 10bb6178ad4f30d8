"""Health alerts pushed to webhooks: the pure diff of checks into events, and a real cluster
POSTing the raise and the clear of OSD_DOWN to a receiver on loopback while a receiver that
hangs and one that answers 500 do not hold the monitor up."""

import json
import time

import pytest

from cairn.mon.alerts import changes
from tests.helpers import WebhookReceivers, run

EVENT_KEYS = {"cluster", "check", "severity", "summary", "detail", "state", "time"}


def check(severity, summary, detail=()):
    return {"severity": severity, "summary": summary, "detail": list(detail), "since": 1.0}


@pytest.mark.unit
def test_raises_changes_and_clears_are_events_and_detail_alone_is_not():
    warn = check("HEALTH_WARN", "1 of 3 OSDs down: osd.1", ["osd.1 (host h2) is down"])
    events = changes({}, {"OSD_DOWN": warn}, "fsid", 5.0)
    assert events == [{"cluster": "fsid", "check": "OSD_DOWN", "severity": "HEALTH_WARN",
                       "summary": warn["summary"], "detail": warn["detail"], "state": "raised",
                       "time": 5.0}]
    moved = check("HEALTH_WARN", warn["summary"], ["figures moved"])
    assert changes({"OSD_DOWN": warn}, {"OSD_DOWN": moved}, "fsid", 6.0) == []
    worse = check("HEALTH_ERR", warn["summary"])
    assert [e["state"] for e in changes({"OSD_DOWN": warn}, {"OSD_DOWN": worse}, "f", 7.0)] == \
        ["raised"]
    (cleared,) = changes({"OSD_DOWN": warn}, {}, "fsid", 8.0)
    assert cleared["state"] == "cleared" and set(cleared) == EVENT_KEYS


@pytest.mark.cluster
def test_the_leader_posts_raise_and_clear_and_bad_receivers_hold_nothing_up(local_cluster):
    receivers = WebhookReceivers()
    try:
        cluster = local_cluster(hosts=3, config=("mon.osd_grace_s=3",
                                                 "osd.heartbeat_interval_s=0.5"))
        _, status = cluster.cairn("status")
        urls = receivers.urls
        cluster.cairn("config", "set", "alert.webhooks",
                      f"{urls['hang']},{urls['broken']},{urls['good']}")
        time.sleep(2)
        began = time.monotonic()
        cluster.script("kill", "osd.1")
        down_s = cluster.wait_for("osd.1 down", lambda: not cluster.osd(1)["up"], 20)
        raised = cluster.wait_for("OSD_DOWN raised at the receiver", lambda: any(
            e["check"] == "OSD_DOWN" and e["state"] == "raised" for e in receivers.events), 20)
        cluster.script("restart", "osd.1")
        cluster.wait_for("OSD_DOWN cleared at the receiver", lambda: any(
            e["check"] == "OSD_DOWN" and e["state"] == "cleared" for e in receivers.events), 30)
        events = [e for e in receivers.events if e["check"] == "OSD_DOWN"]
        assert [e["state"] for e in events] == ["raised", "cleared"], json.dumps(events)
        assert all(set(e) == EVENT_KEYS and e["cluster"] == status["fsid"] for e in events)
        assert events[0]["severity"] == "HEALTH_WARN" and "osd.1" in events[0]["summary"]
        assert any("osd.1" in line for line in events[0]["detail"])
        print(f"osd.1 marked down {down_s:.1f} s after SIGKILL with a hanging and a failing "
              f"webhook configured; OSD_DOWN posted {time.monotonic() - began - down_s:.1f} s "
              f"after that (raised seen within {raised:.1f} s of the mark)")
        assert down_s < 10
    finally:
        receivers.stop()


@pytest.mark.unit
def test_a_failing_receiver_is_retried_with_backoff_and_a_dead_one_is_given_up(monkeypatch):
    import asyncio

    from aiohttp import web

    from cairn.mon import alerts
    monkeypatch.setattr(alerts, "BACKOFF_FIRST_S", 0.01)
    got, answers = [], [500, 503, 200]

    async def flaky(request):
        got.append(await request.json())
        return web.Response(status=answers.pop(0) if answers else 200)

    async def scenario():
        app = web.Application()
        app.router.add_post("/flaky", flaky)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        alerter = alerts.Alerter()
        dead = "http://127.0.0.1:1/nobody"              # connection refused, every attempt
        alerter.set_urls([f"http://127.0.0.1:{port}/flaky", dead])
        alerter.push(changes({}, {"X": check("HEALTH_WARN", "x")}, "fsid", 1.0))
        for _ in range(500):
            if alerter.sent_total == 1 and alerter.dropped_total == 1:
                break
            await asyncio.sleep(0.01)
        await alerter.close()
        await runner.cleanup()
        return alerter

    alerter = run(scenario())
    assert len(got) == 3 and all(event == got[0] for event in got)     # two refusals, then ok
    assert (alerter.sent_total, alerter.dropped_total) == (1, 1)
