"""Authentication and caps on a real cluster (auth on, as cairn-cluster makes it by default):
a key limited to a pool's prefix reads and writes only there, a read-only key cannot write, a
mon=r key cannot change pools, no key and a wrong key get nothing, every refusal is in the
audit log, and a removed key is refused within the ticket lifetime."""

import os
import time

import pytest

from cairn.client import errors
from cairn.client.cluster import Cluster
from tests.helpers import run

pytestmark = pytest.mark.cluster


def test_caps_by_pool_and_prefix_audit_and_revocation(local_cluster, tmp_path):
    cluster = local_cluster(hosts=3, device_size="512M", config=("auth.ticket_ttl_s=4",))
    cluster.cairn("pool", "create", "ckpt", "--replicated", "3", "--pg-num", "8")
    cluster.cairn("pool", "create", "other", "--replicated", "3", "--pg-num", "8")
    alice = str(tmp_path / "alice.keyring")
    reader = str(tmp_path / "reader.keyring")
    _, added = cluster.cairn("auth", "add", "client.alice", "--caps", "mon=r", "--caps",
                             "osd=rw pool=ckpt prefix=team-a/", "--keyring-out", alice)
    assert added["caps"] == ["mon=r", "osd=rw pool=ckpt prefix=team-a/"]
    assert oct(os.stat(alice).st_mode & 0o777) == "0o600"
    cluster.cairn("auth", "add", "client.reader", "--caps", "mon=r", "--caps", "osd=r",
                  "--keyring-out", reader)

    async def as_users():
        async with await Cluster.connect(cluster.dir) as admin:
            await admin.pool("ckpt").put("team-b/secret", b"not alice's")
            await admin.pool("other").put("team-a/x", b"other pool")
        async with await Cluster.connect(cluster.dir, name="client.alice",
                                         keyring=alice) as client:
            ckpt = client.pool("ckpt")
            await ckpt.put("team-a/step-1", b"mine" * 1000)
            assert bytes(await ckpt.get("team-a/step-1")) == b"mine" * 1000
            for denied in (ckpt.put("team-b/x", b"no"), ckpt.get("team-b/secret"),
                           ckpt.delete("team-b/secret"),
                           client.pool("other").get("team-a/x")):
                with pytest.raises(errors.PermissionDenied, match="client.alice may not"):
                    await denied
            assert (await ckpt.list())[0] == ["team-a/step-1"]   # team-b/secret not shown
        async with await Cluster.connect(cluster.dir, name="client.reader",
                                         keyring=reader) as client:
            assert bytes(await client.pool("ckpt").get("team-b/secret")) == b"not alice's"
            with pytest.raises(errors.PermissionDenied, match="needs osd=rw"):
                await client.pool("ckpt").put("team-a/y", b"read-only")
        with pytest.raises(errors.PermissionDenied, match="does not know client.alice's key"):
            wrong = str(tmp_path / "wrong.keyring")
            from cairn.common import auth
            auth.write_keyring(wrong, {"client.alice": (auth.new_secret(), [])})
            await Cluster.connect(cluster.dir, name="client.alice", keyring=wrong)
    run(as_users())

    status, reply = cluster.cairn("--name", "client.alice", "--keyring", alice, "pool", "rm",
                                  "ckpt", check=False)
    assert status == 1 and reply["error"] == "permission_denied" and "mon=rw" in reply["message"]
    status, reply = cluster.cairn("--cluster", cluster.description["mons"][0]["addr"],
                                  "status", check=False)             # no keyring found: no key
    assert status == 1 and "requires authentication" in reply["message"], reply

    def audited():
        _, found = cluster.cairn("audit", "--entity", "client.alice")
        return {(event["op"], event["target"].split(".~s.")[0], event["result"])
                for event in found["events"]}
    cluster.wait_for("refusals in the audit log", lambda: {
        ("put", "ckpt/team-b/x", "permission_denied"),
        ("get", "ckpt/team-b/secret", "permission_denied"),
        ("pool_delete", "ckpt", "permission_denied")} <= audited(), 10)
    assert ("put", "ckpt/team-a/step-1", "ok") in audited()

    # Revocation: an open session and its tickets end within the ticket lifetime (4 s here).
    async def revoked():
        async with await Cluster.connect(cluster.dir, name="client.alice", keyring=alice,
                                         op_timeout_s=5) as client:
            await client.pool("ckpt").put("team-a/before", b"ok")
            cluster.cairn("auth", "rm", "client.alice")
            started = time.monotonic()
            while True:
                try:
                    await client.pool("ckpt").put("team-a/after", b"still?")
                except (errors.PermissionDenied, errors.Timeout):
                    return time.monotonic() - started
                assert time.monotonic() - started < 15, "a removed key kept writing"
                await __import__("asyncio").sleep(0.5)
    assert run(revoked()) < 15
