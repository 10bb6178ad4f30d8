"""The mount's entry cache (client/fs_cache.py) on a fake clock: what a page covers, found and
absent answers, this client's own changes, expiry, overlapping pages and the size bound."""

import pytest

from cairn.client import fs_cache
from cairn.client.fs_cache import EntryCache, key_before

pytestmark = pytest.mark.unit


class Clock:
    now = 100.0

    def __call__(self):
        return self.now


def test_a_page_answers_what_it_covers_until_it_is_older_than_the_ttl():
    clock = Clock()
    cache = EntryCache(1.0, clock)
    assert cache.find(7, b"\x01b") == (False, None)
    # A page read after key_before("b"): entries b and d, more after d.
    cache.put(7, key_before(b"\x01b"), [(b"\x01b", b"B"), (b"\x01d", b"D")], more=True)
    assert cache.find(7, b"\x01b") == (True, b"B")
    assert cache.find(7, b"\x01c") == (True, None)          # absent, inside the page
    assert cache.find(7, b"\x01e") == (False, None)         # past its last key: unknown
    assert cache.find(7, b"\x01a") == (False, None)         # before it
    assert cache.find(8, b"\x01b") == (False, None)         # another directory
    # The directory's last page covers everything after it.
    cache.put(7, b"\x01d", [(b"\x01x", b"X")], more=False)
    assert cache.find(7, b"\x01zzz") == (True, None) and cache.find(7, b"\x01x") == (True, b"X")
    clock.now += 1.5
    assert cache.find(7, b"\x01b") == (False, None) and cache.find(7, b"\x01x") == (False, None)


def test_own_changes_show_and_a_forgotten_directory_is_read_again():
    clock = Clock()
    cache = EntryCache(1.0, clock)
    cache.put(7, b"\x01", [(b"\x01a", b"A")], more=False)
    cache.note(7, b"\x01n", b"N")                           # created here
    cache.note(7, b"\x01a", None)                           # removed here
    assert cache.find(7, b"\x01n") == (True, b"N") and cache.find(7, b"\x01a") == (True, None)
    cache.note(9, b"\x01n", b"N")                           # no page: nothing to change
    assert cache.find(9, b"\x01n") == (False, None)
    cache.forget(7)
    assert cache.find(7, b"\x01n") == (False, None)


def test_overlapping_pages_leave_the_newest_and_the_size_stays_bounded(monkeypatch):
    clock = Clock()
    cache = EntryCache(10.0, clock)
    cache.put(1, b"\x01", [(b"\x01a", b"old")], more=False)
    cache.put(1, b"\x01", [(b"\x01b", b"new")], more=True)  # covers (\x01, b]
    assert cache.find(1, b"\x01a") == (True, None) and cache.find(1, b"\x01c") == (False, None)
    monkeypatch.setattr(fs_cache, "CACHE_BYTES_MAX", 30)     # 9 bytes a page below
    for directory in range(2, 20):
        cache.put(directory, b"\x01", [(b"\x01%d" % i, b"v") for i in range(3)], more=False)
    assert cache._bytes <= 30
    assert cache.find(19, b"\x011") == (True, b"v")          # the newest stay
    assert cache.find(2, b"\x011") == (False, None)          # the oldest went


def test_key_before_sorts_just_below_its_key():
    for key in (b"\x01a", b"\x01file-0001", b"\x01\xff\x01"):
        before = key_before(key)
        assert before < key and not before < key[:-1]
