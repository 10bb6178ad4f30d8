"""Three monitors in a Raft quorum, against real processes: SIGKILL the leader in a stream of map
changes, restart followers (caught up from the log and from a snapshot), two of three dead,
membership changes, and (isolated mode, root) a partition that cuts the leader off.

Map changes here are pool creations: each acknowledged one must be in every monitor's map
afterwards, so "no acknowledged change lost" is checked name by name.
"""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from cairn.cluster.cli import is_ours
from cairn.common.messenger import ConnectionClosed, RequestFailed, RequestTimeout
from cairn.common.monclient import MonClient, MonitorsUnavailable
from tests.helpers import admin_auth, connect_as_admin, isolated_up, run

pytestmark = pytest.mark.faults

# The bound: a new leader and a successful map change within 5 s of losing the leader.
FAILOVER_S_MAX = 5.0


def mons(cluster_or_description):
    description = cluster_or_description if isinstance(cluster_or_description, dict) else \
        cluster_or_description.description
    return {mon["name"]: mon for mon in description["mons"]}


async def ask(addr, header, timeout_s=10.0):
    """One request to one monitor (no fail-over): the reply header."""
    connection = await connect_as_admin(addr)
    try:
        reply = await connection.request(header, timeout_s=timeout_s)
        return dict(reply.header)
    finally:
        await connection.close()


def epoch_at(addr):
    try:
        return run(ask(addr, {"op": "hello"}))["epoch"]
    except RequestFailed as exc:
        # A joining monitor knows no keys until it has caught up with the leader.
        if exc.code != "permission_denied":
            raise
        return 0


def leader_of(cluster):
    _, status = cluster.cairn("status")
    return status["mons"]["leader"], status


def sigkill(cluster, name):
    entry = mons(cluster)[name]
    assert is_ours(entry["pid"], cluster.dir)
    os.kill(entry["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_ours(entry["pid"], cluster.dir):
        assert time.monotonic() < deadline, f"{name} did not die"
        time.sleep(0.02)


def pools_everywhere(cluster, names):
    """Each running monitor's pools (its own applied map)."""
    found = {}
    for name in names:
        addr = mons(cluster)[name]["addr"]

        async def pools():
            monc = MonClient([addr], deadline_s=10, authenticate=admin_auth())
            try:
                return set((await monc.get_map()).pools)
            finally:
                await monc.close()
        found[name] = run(pools())
    return found


def test_leader_sigkill_mid_stream_loses_no_acknowledged_change(local_cluster):
    cluster = local_cluster(hosts=3, mons=3)
    leader, _ = leader_of(cluster)
    addrs = [mon["addr"] for mon in mons(cluster).values()]
    acknowledged, failed = [], []

    async def stream():
        monc = MonClient(addrs, deadline_s=15, name="test", authenticate=admin_auth())
        loop = asyncio.get_running_loop()
        killed_at = first_after_kill = None
        try:
            for index in range(40):
                if index == 12:
                    await loop.run_in_executor(None, sigkill, cluster, leader)
                    killed_at = loop.time()
                try:
                    await monc.request({"op": "pool_create", "name": f"p{index}",
                                        "kind": "replicated", "size": 3, "pg_num": 1})
                    acknowledged.append(f"p{index}")
                    if killed_at is not None and first_after_kill is None:
                        first_after_kill = loop.time() - killed_at
                except (RequestFailed, MonitorsUnavailable) as exc:
                    failed.append((index, str(exc)))
        finally:
            await monc.close()
        return first_after_kill

    failover_s = run(stream())
    print(f"first acknowledged change {failover_s:.2f} s after SIGKILL of the leader {leader}; "
          f"refused: {failed}")
    assert failover_s is not None and failover_s <= FAILOVER_S_MAX, failover_s
    # Not even the change in flight at the SIGKILL fails: MonClient re-sends it with the same
    # request id, and the new leader does it, or answers that it was done.
    assert not failed and len(acknowledged) == 40, failed
    new_leader, status = leader_of(cluster)
    assert new_leader not in (None, leader) and status["mons"]["quorum"]
    survivors = [name for name in mons(cluster) if name != leader]
    for name, pools in pools_everywhere(cluster, survivors).items():
        assert set(acknowledged) <= pools, f"{name} lost {set(acknowledged) - pools}"
    # The old leader comes back as a follower and catches up.
    cluster.script("restart", leader)
    target = status["epoch"]
    cluster.wait_for(f"{leader} catches up to epoch {target}",
                     lambda: epoch_at(mons(cluster)[leader]["addr"]) >= target, 10)
    assert set(acknowledged) <= pools_everywhere(cluster, [leader])[leader]


def test_a_request_re_sent_after_a_lost_reply_is_done_once(local_cluster):
    """A client that lost a reply re-sends the request with the same request id (rid), to any
    monitor, even after the leader died: it gets the first outcome, and the map changes once."""
    cluster = local_cluster(hosts=3, mons=3)
    leader, _ = leader_of(cluster)
    follower, other = [name for name in sorted(mons(cluster)) if name != leader]
    addr = {name: mon["addr"] for name, mon in mons(cluster).items()}
    create = {"op": "pool_create", "name": "once", "kind": "replicated", "size": 3,
              "pg_num": 1, "rid": "test.1"}
    first = run(ask(addr[leader], create))
    again = run(ask(addr[follower], create))              # forwarded to the leader
    assert again["pool"] == first["pool"] and again["epoch"] >= first["epoch"], (first, again)
    with pytest.raises(RequestFailed, match="exists"):    # a new request id is a new request
        run(ask(addr[leader], {**create, "rid": "test.2"}))
    sigkill(cluster, leader)                              # the outcomes are replicated state
    cluster.wait_for("a new leader", lambda: run(ask(addr[other], {"op": "status"}))
                     ["mons"]["leader"] in (follower, other), 10)
    after = run(ask(addr[other], create))
    assert after["pool"] == first["pool"] and after["epoch"] >= first["epoch"], (first, after)
    delete = {"op": "pool_delete", "name": "once", "rid": "test.3"}
    deleted = run(ask(addr[follower], delete))
    assert run(ask(addr[other], delete))["epoch"] >= deleted["epoch"]     # not "no such pool"
    with pytest.raises(RequestFailed, match="must be a string"):
        run(ask(addr[other], {**delete, "rid": 7}))


def test_a_leader_that_stops_or_is_removed_hands_over_at_once(local_cluster):
    """SIGTERM to the leader, or its removal: it hands the leadership to an up-to-date member,
    which campaigns at once instead of after an election timeout (1.5-3 s)."""
    cluster = local_cluster(hosts=3, mons=3)
    leader, _ = leader_of(cluster)

    def change_after(stop):
        async def timed():
            survivors = [mon["addr"] for name, mon in mons(cluster).items() if name != leader]
            monc = MonClient(survivors, deadline_s=15, authenticate=admin_auth())
            try:
                await monc.request({"op": "hello"})               # connected beforehand
                started = time.monotonic()
                await asyncio.get_running_loop().run_in_executor(None, stop)
                stopped = time.monotonic()
                await monc.request({"op": "config_set", "key": "osd.heartbeat_peers",
                                    "value": "2"})
                return stopped - started, time.monotonic() - stopped
            finally:
                await monc.close()
        return run(timed())

    def log_of(name):
        return open(f"{cluster.dir}/logs/{name}.log").read()

    stop_s, change_s = change_after(lambda: cluster.script("kill", leader, "--signal", "TERM"))
    successor, status = leader_of(cluster)
    print(f"SIGTERM to the leader {leader}: it stopped in {stop_s:.2f} s, handing over to "
          f"{successor}; next change {change_s:.2f} s after it exited")
    assert f"{leader} handed the leadership to {successor} before stopping" in log_of(leader)
    assert f"handed over by {leader}" in log_of(successor)
    cluster.script("restart", leader)
    leader = successor
    stop_s, change_s = change_after(lambda: cluster.cairn("mon", "remove", leader))
    successor, status = leader_of(cluster)
    print(f"removal of the leader {leader} took {stop_s:.2f} s (CLI included), handing over to "
          f"{successor}; next change {change_s:.2f} s later")
    assert successor != leader and leader not in status["mons"]["members"]
    assert f"handed over by {leader}" in log_of(successor)


def test_a_new_leader_gives_every_osd_a_fresh_grace_period(local_cluster):
    """Heartbeats go to the leader only: a follower that becomes leader long after it last saw
    one must not take the OSDs for silent (it once did, marking every OSD down at once)."""
    cluster = local_cluster(hosts=3, mons=3)
    grace_s = 5.0
    cluster.cairn("config", "set", "mon.osd_grace_s", str(grace_s))
    cluster.cairn("config", "set", "osd.heartbeat_interval_s", "0.5")
    time.sleep(grace_s + 2)                 # longer than the grace since the followers started
    leader, status = leader_of(cluster)
    epoch = status["epoch"]
    sigkill(cluster, leader)
    survivor = next(name for name in mons(cluster) if name != leader)
    cluster.wait_for("a new leader", lambda: run(ask(mons(cluster)[survivor]["addr"],
                                                     {"op": "status"}))["mons"]["leader"]
                     not in (None, leader), 10)
    time.sleep(grace_s / 2)
    _, status = cluster.cairn("status")
    assert status["osds"] == {"total": 3, "up": 3, "in": 3}, status["osds"]
    assert status["epoch"] == epoch, f"the map changed from {epoch} to {status['epoch']}"
    new_leader = status["mons"]["leader"]
    log_text = open(f"{cluster.dir}/logs/{new_leader}.log").read()
    assert f"{new_leader} leads" in log_text and "failure detector" not in log_text


def test_followers_catch_up_from_the_log_and_from_a_snapshot(local_cluster):
    cluster = local_cluster(hosts=3, mons=3)
    leader, _ = leader_of(cluster)
    behind_log, behind_snapshot = [name for name in sorted(mons(cluster)) if name != leader]
    sigkill(cluster, behind_snapshot)
    addrs = [mons(cluster)[leader]["addr"]]

    async def changes(count, start):
        monc = MonClient(addrs, deadline_s=15, authenticate=admin_auth())
        try:
            for index in range(start, start + count):
                await monc.request({"op": "config_set", "key": "osd.heartbeat_peers",
                                    "value": str(2 + index % 3)})
        finally:
            await monc.close()

    # More changes than the leader keeps in its log after a snapshot (monitor.py: snapshots
    # every 512 entries, 512 kept before it): the restarted follower needs the snapshot.
    started = time.monotonic()
    run(changes(1100, 0))
    print(f"1100 map changes through a 2-of-3 quorum in {time.monotonic() - started:.1f} s")
    cluster.script("restart", behind_snapshot)
    target = epoch_at(mons(cluster)[leader]["addr"])
    cluster.wait_for(f"{behind_snapshot} catches up to epoch {target}",
                     lambda: epoch_at(mons(cluster)[behind_snapshot]["addr"]) >= target, 15)
    sigkill(cluster, behind_log)
    run(changes(20, 1100))
    cluster.script("restart", behind_log)
    target = epoch_at(mons(cluster)[leader]["addr"])
    cluster.wait_for(f"{behind_log} catches up to epoch {target}",
                     lambda: epoch_at(mons(cluster)[behind_log]["addr"]) >= target, 15)
    snapshot_log = open(f"{cluster.dir}/logs/{behind_snapshot}.log").read()
    log_log = open(f"{cluster.dir}/logs/{behind_log}.log").read()
    assert "installed a snapshot" in snapshot_log
    assert "installed a snapshot" not in log_log
    # Every monitor at one log index. The leader may have just appended an entry (an OSD's
    # report) that its followers take a moment later, so this is waited for, not read once.
    seen = []

    def level():
        _, status = cluster.cairn("status")
        seen.append(status["mons"]["positions"])
        return len({seen[-1][name]["log_index"] for name in mons(cluster)}) == 1
    try:
        cluster.wait_for("every monitor at the same log index", level, 10)
    except AssertionError:
        raise AssertionError(f"monitors' positions never met: {seen[-3:]}") from None


def test_two_of_three_dead_refuses_changes_keeps_reads_then_resumes(local_cluster):
    cluster = local_cluster(hosts=3, mons=3)
    cluster.cairn("pool", "create", "kept", "--replicated", "3", "--pg-num", "4")
    leader, _ = leader_of(cluster)
    dead = [name for name in sorted(mons(cluster)) if name != leader][:1] + [leader]
    for name in dead:
        sigkill(cluster, name)
    code, refused = cluster.cairn("pool", "create", "refused", "--replicated", "3",
                                  check=False)
    assert code != 0 and refused["error"] == "no_quorum", refused
    assert "no quorum" in refused["message"]
    assert [pool["name"] for pool in cluster.cairn("pool", "ls")[1]["pools"]] == ["kept"]
    assert len(cluster.cairn("osd", "tree")[1]["osds"]) == 3
    _, status = cluster.cairn("status")
    assert status["mons"]["leader"] is None and "MON_NO_QUORUM" in status["checks"]
    cluster.script("restart", dead[0])
    started = time.monotonic()
    cluster.cairn("pool", "create", "after", "--replicated", "3", "--pg-num", "4")
    print(f"map change {time.monotonic() - started:.2f} s after a second monitor returned")
    names = [pool["name"] for pool in cluster.cairn("pool", "ls")[1]["pools"]]
    assert names == ["after", "kept"]


def test_monitors_are_removed_and_added_one_at_a_time(local_cluster):
    cluster = local_cluster(hosts=3, mons=3)
    description = cluster.description
    fsid = cluster.cairn("status")[1]["fsid"]
    leaving = "mon.2"
    remove = {"op": "mon_remove", "name": leaving, "rid": "test.rm"}
    removed = run(ask(mons(cluster)["mon.0"]["addr"], remove))
    assert removed["members"] == ["mon.0", "mon.1"]
    again = run(ask(mons(cluster)["mon.1"]["addr"], remove))    # its reply lost, re-sent
    assert again == removed, (removed, again)
    entry = mons(cluster)[leaving]
    cluster.wait_for(f"{leaving} exits once removed", lambda: not is_ours(entry["pid"],
                                                                          cluster.dir), 10)
    cluster.cairn("config", "set", "osd.heartbeat_peers", "2")        # 2 of 2 still commit
    # A new monitor: made empty with --join, started, then added; it catches up.
    new_dir = os.path.join(cluster.dir, "mon.3")
    subprocess.run([sys.executable, "-m", "cairn.mon.cli", "mkfs", "--dir", new_dir, "--fsid",
                    fsid, "--join", "--name", "mon.3", "--keyring",
                    os.path.join(cluster.dir, "keys", "bootstrap.keyring")],
                   check=True, capture_output=True)
    addr = entry["addr"]                                              # mon.2's port is free
    ready = os.path.join(cluster.dir, "run", "mon.3.ready")
    with open(os.path.join(cluster.dir, "logs", "mon.3.log"), "ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "cairn.mon.cli", "run", "--dir",
                                    new_dir, "--bind", addr, "--name", "mon.3", "--ready-file",
                                    ready], stdout=log, stderr=log, start_new_session=True)
    try:
        cluster.wait_for("mon.3 serving", lambda: os.path.exists(ready), 20)
        _, added = cluster.cairn("mon", "add", "mon.3", addr)
        assert added["members"] == ["mon.0", "mon.1", "mon.3"]
        target = epoch_at(description["mons"][0]["addr"])
        cluster.wait_for("mon.3 catches up", lambda: epoch_at(addr) >= target, 10)
        _, twice = cluster.cairn("mon", "add", "mon.3", addr)        # a retry: same answer
        assert twice["already"] and twice["members"] == ["mon.0", "mon.1", "mon.3"]
        code, elsewhere = cluster.cairn("mon", "add", "mon.3", "127.0.0.1:1", check=False)
        assert code != 0 and "already a monitor, at " + addr in elsewhere["message"]
        _, status = cluster.cairn("status")
        assert status["mons"]["members"] == ["mon.0", "mon.1", "mon.3"]
        assert sorted(status["mons"]["quorum"]) == ["mon.0", "mon.1", "mon.3"]
    finally:
        process.kill()
        process.wait()


# -- isolated mode: a real partition --------------------------------------------------------------

def needs_root(test):
    test = pytest.mark.skipif(os.geteuid() != 0, reason="isolated mode needs root (network "
                              "namespaces, loop devices); CI runs as root")(test)
    return pytest.mark.skipif(shutil.which("nft") is None, reason="nftables is not installed "
                              "(cluster-scripts/setup.sh installs it)")(test)


@pytest.fixture
def isolated_three_mons(disk_dir):
    with isolated_up(os.path.join(str(disk_dir), "isolated-mons"), "--mons", "3") as directory:
        yield directory


@needs_root
def test_a_partitioned_leader_steps_down_and_the_majority_elects(isolated_three_mons):
    directory = isolated_three_mons

    def cli(*args, check=True):
        result = subprocess.run([sys.executable, "-m", "cairn.client.cli", "--cluster",
                                 directory, "--json", *args], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0 or not check, result.stderr
        return json.loads(result.stdout.strip().splitlines()[-1])

    with open(os.path.join(directory, "cluster.json")) as handle:
        description = json.load(handle)
    old = cli("status")["mons"]["leader"]
    entry = mons(description)[old]
    others = [host for host in description["isolation"]["hosts"] if host != entry["host"]]
    subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "fault", "--dir", directory,
                    "partition", entry["host"], ",".join(others)], check=True,
                   capture_output=True, timeout=60)
    started = time.monotonic()
    majority = [mon["addr"] for name, mon in mons(description).items() if name != old]

    def new_leader():
        try:
            view = run(ask(majority[0], {"op": "status"}, timeout_s=8))["mons"]
        except (RequestFailed, RequestTimeout, ConnectionClosed):
            return None
        return view["leader"] if view["leader"] not in (None, old) else None

    while new_leader() is None:
        assert time.monotonic() - started < 15, "the majority elected no leader"
        time.sleep(0.2)
    elected_s = time.monotonic() - started

    async def change():
        monc = MonClient(majority, deadline_s=10, authenticate=admin_auth())
        try:
            await monc.request({"op": "config_set", "key": "osd.heartbeat_peers", "value": "2"})
        finally:
            await monc.close()
    run(change())
    changed_s = time.monotonic() - started

    def own_view():
        return run(ask(entry["addr"], {"op": "status", "local": True}, timeout_s=10))["mons"]

    # Check-quorum runs every election timeout (1.5 s): the old leader steps down within two.
    while own_view()["positions"][old]["role"] == "leader":
        assert time.monotonic() - started < 10, f"{old} never stepped down"
        time.sleep(0.1)
    stepped_down_s = time.monotonic() - started
    view = own_view()
    print(f"partitioned leader {old}: new leader elected in {elected_s:.1f} s, a map change in "
          f"{changed_s:.1f} s, the old leader stepped down within {stepped_down_s:.1f} s (its "
          f"own view: {view['positions'][old]})")
    assert view["leader"] in (None, new_leader())
    # A client on the cut-off monitor has its last map and gets no pushes; told of a newer
    # epoch (as an OSD's refusal would), it moves to a monitor that knows a leader.
    target = run(ask(majority[0], {"op": "hello"}))["epoch"]

    async def catch_up():
        monc = MonClient([entry["addr"]] + majority, deadline_s=10, name="test",
                         authenticate=admin_auth())
        try:
            stale = (await monc.subscribe()).epoch
            started = time.monotonic()
            await monc.wait_for_epoch(target, timeout_s=10)
            return stale, time.monotonic() - started, monc._connection.addr
        finally:
            await monc.close()
    stale, caught_up_s, addr = run(catch_up())
    print(f"a client subscribed to the cut-off {old} (epoch {stale}) reached epoch {target} "
          f"in {caught_up_s:.2f} s, now on {addr}")
    assert stale < target and addr in majority, (stale, target, addr)
    subprocess.run([sys.executable, "-m", "cairn.cluster.cli", "fault", "--dir", directory,
                    "clear"], check=True, capture_output=True, timeout=60)
    target = run(ask(majority[0], {"op": "hello"}))["epoch"]
    deadline = time.monotonic() + 15
    while run(ask(entry["addr"], {"op": "hello"}))["epoch"] < target:
        assert time.monotonic() < deadline, f"{old} did not catch up after the partition"
        time.sleep(0.2)


async def forge_raft(addr, fsid, sender, message, keyring=None):
    """Send one Raft message as `sender` (as a broken or hostile peer would): the reply, or the
    RequestFailed it was refused with. With `keyring`, authenticated with its mon. key."""
    import msgpack
    from cairn.common import auth, messenger, sessions
    authenticate = None
    if keyring is not None:
        authenticate = sessions.monitor_handshake("mon.", auth.read_keyring(keyring)["mon."])
    connection = await messenger.connect(addr, timeout_s=5, authenticate=authenticate)
    try:
        return await connection.request(
            {"op": "raft", "from": sender, "addr": "127.0.0.1:1", "fsid": fsid},
            msgpack.packb([message]), timeout_s=5)
    except RequestFailed as exc:
        return exc
    finally:
        await connection.close()


@pytest.mark.parametrize("auth_mode", ["none", "mon. key"])
def test_a_forged_raft_message_is_refused_and_named_in_health(local_cluster, auth_mode):
    # Before: one APPEND in the leader's own term from another name reached an assert in the
    # Raft core, and the messenger ended the leader with os._exit(70).
    from cairn.mon import raft
    cluster = local_cluster(hosts=1, mons=3,
                            extra=("--auth", "none") if auth_mode == "none" else ())
    keyring = None if auth_mode == "none" else os.path.join(cluster.dir, "keys", "mon.keyring")
    leader, status = leader_of(cluster)
    term, fsid = status["mons"]["term"], status.get("fsid")
    addrs = {name: entry["addr"] for name, entry in mons(cluster).items()}
    follower, other = sorted(name for name in addrs if name != leader)
    append = {"k": raft.Kind.APPEND.value, "s": follower, "t": leader, "T": term}
    refused = run(forge_raft(addrs[leader], fsid, follower, append, keyring))
    assert isinstance(refused, RequestFailed) and refused.code == "invalid", refused
    assert "two leaders in term" in refused.message, refused.message
    # A follower refuses a heartbeat from a second leader too, and tells the leader.
    beat = {"k": raft.Kind.HEARTBEAT.value, "s": other, "t": follower, "T": term}
    refused = run(forge_raft(addrs[follower], fsid, other, beat, keyring))
    assert isinstance(refused, RequestFailed) and f"{leader} leads it" in refused.message
    assert is_ours(mons(cluster)[leader]["pid"], cluster.dir), "the leader died"
    deadline = time.monotonic() + 15
    while True:
        _, detail = cluster.cairn("health", "detail")
        check = detail["checks"].get("MON_PEER_INVALID")
        lines = " ".join(check["detail"]) if check else ""
        if f"{leader} refused" in lines and f"{follower} refused" in lines:
            break
        assert time.monotonic() < deadline, f"MON_PEER_INVALID incomplete: {check}"
        time.sleep(0.5)
    assert follower in check["summary"] and other in check["summary"], check
    assert check["severity"] == "HEALTH_WARN" and "two leaders" in lines, check
    # The monitors keep serving: the same leader commits a map change.
    cluster.cairn("pool", "create", "after-forgery", "--replicated", "1")
    assert leader_of(cluster)[0] == leader
