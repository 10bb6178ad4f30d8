"""Fault injection against real processes: SIGKILL and SIGSTOP of OSDs, SIGKILL of the monitor.

Short timings come from the cluster config the test sets at bring-up (grace 3 s, down-out 3 s,
heartbeats every 0.5 s); the waits allow generous slack on a loaded 2-core machine, and each
assertion names the state it waited for.
"""

import asyncio
import datetime

import pytest

from tests.helpers import connect_as_admin, run

pytestmark = pytest.mark.faults

FAST = ("mon.osd_grace_s=3", "mon.osd_down_out_interval_s=3", "osd.heartbeat_interval_s=0.5")
GRACE_S = 3.0
SLACK_S = 4.0


def test_killed_osd_goes_down_then_out_and_comes_back(local_cluster):
    cluster = local_cluster(hosts=4, osds_per_host=1, config=FAST)
    cluster.script("kill", "osd.1")                                   # SIGKILL
    cluster.wait_for("osd.1 down", lambda: not cluster.osd(1)["up"], GRACE_S + SLACK_S)
    cluster.wait_for("osd.1 out", lambda: not cluster.osd(1)["in"], 3.0 + SLACK_S + GRACE_S)
    # Down first, out only after the down-out interval (read from the monitor's log).
    when = {}
    for line in open(f"{cluster.dir}/logs/mon.0.log"):
        for event in ("osd_down id=1", "osd_out id=1"):
            if event in line and event not in when:
                when[event] = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    gap_s = (when["osd_out id=1"] - when["osd_down id=1"]).total_seconds()
    assert 3.0 - 0.2 <= gap_s <= 3.0 + SLACK_S, gap_s
    _, status = cluster.cairn("status")
    assert status["osds"] == {"total": 4, "up": 3, "in": 3}
    assert "osd.1" in status["checks"]["OSD_DOWN"] and status["health"] == "HEALTH_WARN"
    cluster.script("restart", "osd.1")
    cluster.wait_for("osd.1 up and in", lambda: cluster.osd(1)["up"] and cluster.osd(1)["in"],
                     SLACK_S)
    _, status = cluster.cairn("status")
    assert status["health"] == "HEALTH_OK", status["checks"]
    # The others never flapped: each booted exactly once (epochs: one boot per OSD).
    log = open(f"{cluster.dir}/logs/mon.0.log").read()
    assert log.count("osd.0 boot") == 1 and log.count("osd.1 boot") == 2


def test_hung_osd_is_marked_down_and_boots_again_when_it_wakes(local_cluster):
    """SIGSTOP: the process holds its sockets but answers nothing, so the only evidence is
    silence (no 'connection refused'). It goes down within the grace period; after SIGCONT it
    sees the map say it is down and boots again by itself."""
    cluster = local_cluster(hosts=3, osds_per_host=1, config=FAST)
    cluster.script("kill", "osd.2", "--signal", "STOP")
    try:
        cluster.wait_for("hung osd.2 down", lambda: not cluster.osd(2)["up"],
                         GRACE_S + SLACK_S)
    finally:
        cluster.script("kill", "osd.2", "--signal", "CONT")
    cluster.wait_for("osd.2 up again", lambda: cluster.osd(2)["up"], GRACE_S + SLACK_S)
    assert "the map says we are down but we are running; booting again" in \
        open(f"{cluster.dir}/logs/osd.2.log").read()


def test_monitor_sigkill_keeps_the_map_and_osds_reconnect(local_cluster):
    cluster = local_cluster(hosts=3, osds_per_host=1, config=FAST)
    cluster.cairn("pool", "create", "data", "--replicated", "3", "--pg-num", "32")
    cluster.cairn("config", "set", "osd.heartbeat_peers", "2")
    _, before = cluster.cairn("status")
    _, pools_before = cluster.cairn("pool", "ls")
    _, tree_before = cluster.cairn("osd", "tree")
    cluster.script("kill", "mon.0")                                   # SIGKILL
    cluster.script("restart", "mon.0")
    _, after = cluster.cairn("status")
    assert after["epoch"] == before["epoch"]                          # nothing acknowledged lost
    assert cluster.cairn("pool", "ls")[1] == pools_before
    assert cluster.cairn("osd", "tree")[1]["osds"] == tree_before["osds"]
    assert cluster.cairn("config", "get", "osd.heartbeat_peers")[1]["value"] == 2
    # A change after the restart reaches every OSD: they resubscribed by themselves.
    cluster.cairn("osd", "out", "0")
    _, status = cluster.cairn("status")
    epoch = status["epoch"]
    osds = cluster.description["osds"]

    async def epochs():
        seen = {}
        for entry in osds:
            connection = await connect_as_admin(entry["addr"])
            try:
                seen[entry["id"]] = (await connection.request({"op": "status"})).header["epoch"]
            finally:
                await connection.close()
        return seen

    cluster.wait_for("every OSD at the new epoch",
                     lambda: set(run(epochs()).values()) == {epoch}, SLACK_S)
    # And they heartbeat to the restarted monitor: nobody is marked down past a grace period.
    run(asyncio.sleep(GRACE_S + 1))
    _, status = cluster.cairn("status")
    assert status["osds"] == {"total": 3, "up": 3, "in": 2}, status
    cluster.cairn("osd", "in", "0")
    assert cluster.osd(0)["in"]


def test_sigterm_stops_an_osd_cleanly_and_the_monitor_knows_at_once(local_cluster):
    """A clean stop tells the monitor first, so the OSD is down without waiting for the grace
    period (20 s by default here: no fast config), and the store closes cleanly."""
    cluster = local_cluster(hosts=3, osds_per_host=1)
    cluster.script("kill", "osd.2", "--signal", "TERM")       # waits until the process is gone
    assert not cluster.osd(2)["up"]
    assert "epoch 5 (osd.2 stopping): osd_down id=2" in open(f"{cluster.dir}/logs/mon.0.log").read()
    assert "osd.2 stopped cleanly" in open(f"{cluster.dir}/logs/osd.2.log").read()
    listing = cluster.script("status").stdout
    assert "osd.2    stopped" in listing and "3 of 4 daemons running" in listing
