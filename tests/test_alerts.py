"""Health alerts pushed to webhooks and kept as the health history: the pure diff of checks into
events, retries, and a real three-monitor cluster POSTing the raise and the clear of OSD_DOWN to
a receiver on loopback while a receiver that hangs and one that answers 500 do not hold the
monitor up, recording them, and a new leader sending nothing again."""

import json
import subprocess
import sys
import time

import pytest

from cairn.mon.alerts import changes
from cairn.mon.monitor import LEADER_SETTLE_S
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
def test_the_leader_posts_and_records_raise_and_clear_and_a_new_leader_repeats_nothing(
        local_cluster):
    """Three monitors; webhooks: one that hangs, one that answers 500, one that records. A
    SIGKILLed OSD is marked down as fast as ever and OSD_DOWN's raise and clear reach the good
    receiver and `cairn health history`; after SIGKILL of the leader, the new one shows the
    same history and sends nothing again."""
    receivers = WebhookReceivers()
    try:
        cluster = local_cluster(hosts=3, mons=3, config=("mon.osd_grace_s=3",
                                                         "osd.heartbeat_interval_s=0.5"))
        _, status = cluster.cairn("status")
        urls = receivers.urls
        cluster.cairn("config", "set", "alert.webhooks",
                      f"{urls['hang']},{urls['broken']},{urls['good']}")
        time.sleep(LEADER_SETTLE_S)                     # the leader's first heartbeats
        began = time.monotonic()
        cluster.script("kill", "osd.1")
        down_s = cluster.wait_for("osd.1 down", lambda: not cluster.osd(1)["up"], 20)
        cluster.wait_for("OSD_DOWN raised at the receiver",
                         lambda: "raised" in receivers.events_of("OSD_DOWN"), 30)
        raised_s = time.monotonic() - began
        cluster.script("restart", "osd.1")
        cluster.wait_for("OSD_DOWN cleared at the receiver",
                         lambda: "cleared" in receivers.events_of("OSD_DOWN"), 30)
        events = [e for e in receivers.events if e["check"] == "OSD_DOWN"]
        assert [e["state"] for e in events] == ["raised", "cleared"], json.dumps(events)
        assert all(set(e) == EVENT_KEYS and e["cluster"] == status["fsid"] for e in events)
        assert events[0]["severity"] == "HEALTH_WARN" and "osd.1" in events[0]["summary"]
        assert any("osd.1" in line for line in events[0]["detail"])
        assert down_s < 10

        def history():
            return cluster.cairn("health", "history", "--limit", "1000")[1]["events"]
        cluster.wait_for("OSD_DOWN cleared in the history", lambda: "cleared" in [
            e["state"] for e in history() if e["check"] == "OSD_DOWN"], 10)
        recorded = history()
        text = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster",
                               cluster.dir, "health", "history"], capture_output=True,
                              text=True, timeout=60).stdout
        assert "raised  WARN OSD_DOWN: " in text and "cleared WARN OSD_DOWN: " in text, text
        assert [e for e in recorded if e["check"] == "OSD_DOWN"] == events
        assert recorded == receivers.events             # the same events, in the same order
        leader = status["mons"]["leader"]
        cluster.script("kill", leader)
        cluster.wait_for("a new leader", lambda: cluster.cairn("status", check=False)[1].get(
            "mons", {}).get("leader") not in (None, leader), 20)
        sent = len(receivers.events)
        time.sleep(LEADER_SETTLE_S + 4)
        assert history()[:len(recorded)] == recorded
        assert receivers.events[sent:] == [], "the new leader sent again: " + json.dumps(
            receivers.events[sent:])
        print(f"osd.1 marked down {down_s:.1f} s after SIGKILL with a hanging and a failing "
              f"webhook configured; OSD_DOWN posted {raised_s:.1f} s after the kill; history "
              f"the same and nothing re-sent after the leader {leader} was killed")
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
