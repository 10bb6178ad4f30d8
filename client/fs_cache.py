"""A mount's cache of directory entries, valid for as long as the kernel keeps what it is told.

The kernel keeps the entries and attributes a mount gives it for ATTR_TIMEOUT_S (1 s), so
another client's change to a file shows on a mount within that time; that is the namespace's
rule across clients. This cache applies the same rule one level down: a lookup that misses
reads a short page of the directory's entries in name order (one op, the attributes of
embedded inodes included) instead of one entry, and lookups that follow within `ttl_s` for
names that page holds are answered from it with no op. A directory's files are usually
looked up in name order (a listing, `ls -l`, `rm -r`, a benchmark, a dataloader walking it), so
one op serves a page's worth of lookups.

The cache also knows which names a page does not hold, but the namespace answers "absent"
only from a fresh read (the kernel is never told a name is absent either), so a file another
client has just closed is found at once: a close on one client and an open on another see
each other (close-to-open).

A directory's own attributes are kept the same way: read within `ttl_s`, with the times this
client's own changes of its entries set since (`dir_attr`). The kernel drops a directory's
attributes after every create or unlink in it and asks again before the next one (its
permission check), inside the one-at-a-time section of that directory; answering from what
this client read and did keeps a round trip out of that section, within the same rule.

It stays correct for its own client: every change this client makes to an entry is applied to
the pages holding it (`note`), or the directory's pages are dropped (`forget`). Conditional
updates keep the store right whatever the cache says: an unlink of an entry that changed
meanwhile forgets the directory and reads it again.
"""

import collections
import time

# Entries one page read for a lookup asks for: enough to serve a run of lookups in name
# order, little enough that a lookup in random order over a huge directory pays little.
PAGE_ENTRIES = 64
# Bytes of entries kept in all (a listing's pages are kept too), least recently used pages
# dropped.
CACHE_BYTES_MAX = 32 << 20
# Directories whose own attributes are kept.
DIR_ATTRS_MAX = 4096


class _Page:
    __slots__ = ("after", "last", "entries", "at")

    def __init__(self, after, last, entries, at):
        self.after = after              # the page covers keys > after ...
        self.last = last                # ... and <= last (None: to the directory's end)
        self.entries = entries          # key -> entry, for the keys it covers
        self.at = at

    def covers(self, key):
        return key > self.after and (self.last is None or key <= self.last)


class EntryCache:
    def __init__(self, ttl_s, clock=time.monotonic):
        self.ttl_s = ttl_s
        self.clock = clock
        self._pages = collections.OrderedDict()     # (dir, after) -> _Page
        self._dirs = {}                             # dir -> {after}
        self._bytes = 0
        self._dir_attrs = {}                        # dir -> (attr dict, read at)

    def dir_attr(self, directory):
        """(attr dict, seconds left) while a read of the directory's attributes is fresh."""
        held = self._dir_attrs.get(directory)
        if held is None:
            return None
        left = self.ttl_s - (self.clock() - held[1])
        if left <= 0:
            del self._dir_attrs[directory]
            return None
        return dict(held[0]), left

    def put_dir_attr(self, directory, attr):
        """The directory's attributes as read (or written) at about now."""
        if len(self._dir_attrs) >= DIR_ATTRS_MAX:
            self._dir_attrs.clear()
        self._dir_attrs[directory] = (dict(attr), self.clock())

    def touch_dir(self, directory, times_ns):
        """This client set the directory's mtime and ctime (with a change of its entries)."""
        held = self._dir_attrs.get(directory)
        if held is not None:
            held[0]["mt"] = held[0]["ct"] = times_ns

    def find(self, directory, key):
        """(True, entry or None) if a fresh page covers `key`; else (False, None)."""
        now = self.clock()
        for after in list(self._dirs.get(directory, ())):
            page = self._pages[directory, after]
            if now - page.at > self.ttl_s:
                self._drop(directory, after)
                continue
            if page.covers(key):
                self._pages.move_to_end((directory, after))
                return True, page.entries.get(key)
        return False, None

    def put(self, directory, after, entries, more):
        """A page read at about now: `entries` [(key, entry)] after key `after`, in order;
        `more`: the directory has keys past the last of them."""
        last = entries[-1][0] if more and entries else None
        if more and not entries:
            return
        for other in list(self._dirs.get(directory, ())):
            page = self._pages[directory, other]
            if not (last is not None and page.after >= last) and \
                    not (page.last is not None and page.last <= after):
                self._drop(directory, other)            # overlaps: the new one wins
        self._drop(directory, after)
        self._pages[directory, after] = _Page(after, last, dict(entries), self.clock())
        self._dirs.setdefault(directory, set()).add(after)
        self._bytes += _size(entries)
        while self._bytes > CACHE_BYTES_MAX and self._pages:
            self._drop(*next(iter(self._pages)))

    def note(self, directory, key, entry):
        """This client set `key` of `directory` to `entry` (None: removed it)."""
        for after in self._dirs.get(directory, ()):
            page = self._pages[directory, after]
            if page.covers(key):
                old = page.entries.pop(key, None)
                if old is not None:
                    self._bytes -= len(key) + len(old)
                if entry is not None:
                    page.entries[key] = entry
                    self._bytes += len(key) + len(entry)

    def forget(self, directory):
        for after in list(self._dirs.get(directory, ())):
            self._drop(directory, after)

    def _drop(self, directory, after):
        page = self._pages.pop((directory, after), None)
        if page is not None:
            self._bytes -= _size(page.entries.items())
        afters = self._dirs.get(directory)
        if afters is not None:
            afters.discard(after)
            if not afters:
                del self._dirs[directory]


def _size(entries):
    return sum(len(key) + len(entry) for key, entry in entries)


def key_before(key):
    """A key just below `key` (a page read after it starts at `key`): the same with its last
    byte one less (names hold no NUL byte, so it is at least 1)."""
    return key[:-1] + bytes([key[-1] - 1])
