"""`cairn://POOL/path` as an fsspec filesystem (registered by entry point as "cairn").

    import fsspec
    with fsspec.open("cairn://ckpt/a/b.pt", "wb") as f:      # the cluster: cluster= storage
        f.write(data)                                         # option, else $CAIRN_CLUSTER
    fs = fsspec.filesystem("cairn", metadata_pool="meta")
    fs.ls("ckpt/a"); fs.mv("ckpt/a/b.pt", "ckpt/a/c.pt")      # mv: the namespace's atomic rename

The first path component is the pool (the data pool; directories live in `metadata_pool`,
else $CAIRN_METADATA_POOL, else the same pool), the rest a path in its namespace
(client/fs.py): files written here and through `cairn mount` are the same files. Options
`prefix="team-a/"` (the namespace under that object-name prefix, as `cairn mount --prefix`),
`name=` and `keyring=` (the key to use; else $CAIRN_NAME, $CAIRN_KEYRING, the admin's). Calls run on the client library's loop in a
background thread (client/sync.py). The filesystem object pickles as its options and connects
again where it is unpickled (DCP's process-based async save pickles its writer).
"""

import errno
import io
import os

from fsspec.spec import AbstractFileSystem

from cairn.client import errors
from cairn.client.fs import Filesystem
from cairn.client.fs_format import _as_oserror, check_prefix, split_path


class CairnFileSystem(AbstractFileSystem):
    protocol = "cairn"
    root_marker = ""

    def __init__(self, cluster=None, metadata_pool=None, op_timeout_s=None, prefix="",
                 name=None, keyring=None, **kwargs):
        super().__init__(cluster=cluster, metadata_pool=metadata_pool,
                         op_timeout_s=op_timeout_s, prefix=prefix, name=name, keyring=keyring,
                         **kwargs)
        self.name, self.keyring = name, keyring
        self.cluster_where = cluster or os.environ.get("CAIRN_CLUSTER")
        self.metadata_pool = metadata_pool or os.environ.get("CAIRN_METADATA_POOL")
        self.prefix = check_prefix(prefix)
        self.op_timeout_s = op_timeout_s
        self._client = None
        self._pid = None
        self._namespaces = {}               # pool -> Filesystem

    # -- plumbing -----------------------------------------------------------------------------

    def _connection(self):
        if self._client is None or self._pid != os.getpid():      # a fork gets its own
            from cairn.client.sync import SyncCluster
            from cairn.client.cluster import OP_TIMEOUT_S_DEFAULT
            self._client = SyncCluster(self.cluster_where,
                                       self.op_timeout_s or OP_TIMEOUT_S_DEFAULT,
                                       name=self.name, keyring=self.keyring)
            self._pid = os.getpid()
            self._namespaces = {}
        return self._client

    def close(self):
        """Close this filesystem's client (its connections and its loop's thread). fsspec keeps
        filesystem objects for reuse, so one closed is still usable: its next call connects
        again."""
        client, self._client, self._namespaces = self._client, None, {}
        if client is not None and self._pid == os.getpid():
            client.close()

    def _call(self, coroutine):
        """Run `coroutine` on the client's loop; client errors arrive as the OSError a file
        system gives (PermissionDenied as PermissionError, EACCES; NoSpace as ENOSPC)."""
        try:
            return self._connection().call(coroutine)
        except errors.ClientError as exc:
            raise _as_oserror(exc) from exc

    def _split(self, path):
        """(Filesystem of the path's pool, path inside it)."""
        parts = split_path(self._strip_protocol(path))
        if not parts:
            raise OSError(errno.EINVAL, "a cairn path names a pool first: cairn://POOL/path")
        pool, inner = parts[0], "/" + "/".join(parts[1:])
        client = self._connection()
        namespace = self._namespaces.get(pool)
        if namespace is None:
            namespace = self._namespaces[pool] = self._call(Filesystem.open(
                client._cluster, pool, metadata_pool=self.metadata_pool, prefix=self.prefix))
        return namespace, inner

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        if path.startswith("cairn://"):
            path = path[len("cairn://"):]
        return path.strip("/")

    def _info_of(self, full, attr):
        kind = {"f": "file", "d": "directory", "l": "link"}[attr.kind]
        return {"name": full, "size": attr.size if kind != "directory" else 0, "type": kind,
                "mode": attr.st_mode(), "mtime": attr.get("mt", 0) / 1e9,
                "created": attr.get("ct", 0) / 1e9, "uid": attr.get("u"), "gid": attr.get("g")}

    # -- the AbstractFileSystem interface ----------------------------------------------------

    def info(self, path, **kwargs):
        full = self._strip_protocol(path)
        namespace, inner = self._split(path)
        try:
            attr = self._call(namespace.stat(inner))
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(errno.ENOENT, f"no such file: cairn://{full}") from None
        return self._info_of(full, attr)

    def ls(self, path, detail=True, **kwargs):
        full = self._strip_protocol(path)
        namespace, inner = self._split(path)
        try:
            attr = self._call(namespace.stat(inner))
        except (FileNotFoundError, NotADirectoryError):
            raise FileNotFoundError(errno.ENOENT, f"no such directory: cairn://{full}") \
                from None
        if not attr.is_dir:
            entries = [self._info_of(full, attr)]
        else:
            entries = [self._info_of(f"{full}/{name}", child)
                       for name, _, child in self._call(namespace.scandir_attrs(inner))]
        return entries if detail else [entry["name"] for entry in entries]

    def mkdir(self, path, create_parents=True, **kwargs):
        namespace, inner = self._split(path)
        if create_parents:
            self._call(namespace.makedirs(inner))
        else:
            self._call(namespace.mkdir_path(inner))

    def makedirs(self, path, exist_ok=False):
        namespace, inner = self._split(path)
        if not exist_ok and self._call(namespace.exists(inner)):
            raise FileExistsError(errno.EEXIST, f"cairn://{self._strip_protocol(path)}")
        self._call(namespace.makedirs(inner))

    def rmdir(self, path):
        namespace, inner = self._split(path)
        self._call(namespace.rmdir_path(inner))

    def _rm(self, path):
        namespace, inner = self._split(path)
        if self._call(namespace.stat(inner, follow=False)).is_dir:
            self._call(namespace.rmdir_path(inner))
        else:
            self._call(namespace.unlink_path(inner))

    def rm_file(self, path):
        """Remove a file, or an empty directory (fsspec's recursive rm removes a tree's paths
        deepest first through this)."""
        self._rm(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """The namespace's atomic rename (a file or a whole directory), never copy-and-delete;
        both paths must be in the same pool."""
        source, inner1 = self._split(path1)
        target, inner2 = self._split(path2)
        if source is not target:
            raise OSError(errno.EXDEV, "cairn mv works within one pool")
        self._call(source.rename_path(inner1, inner2))

    rename = mv

    def cp_file(self, path1, path2, **kwargs):
        """Copy a file's bytes; a directory is made at the target (a recursive copy walks
        the tree through this)."""
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        with self.open(path1, "rb") as source, self.open(path2, "wb") as target:
            while chunk := source.read(8 << 20):
                target.write(chunk)

    def created(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["created"],
                                               tz=datetime.timezone.utc)

    def modified(self, path):
        import datetime
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"],
                                               tz=datetime.timezone.utc)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        namespace, inner = self._split(path)
        mode = mode.replace("t", "").replace("b", "") + "b"
        if any(flag in mode for flag in "wxa"):
            # As on object stores (and what fsspec's callers expect): writing a file makes
            # its parent directories.
            parent = "/".join(split_path(inner)[:-1])
            if parent:
                self._call(namespace.makedirs(parent))
        handle = self._call(namespace.open_path(inner, mode))
        return CairnFile(self, handle, mode, path)


# Writes smaller than this are gathered in the file object and handed to the namespace's
# handle together (each handoff is a call into the client's loop thread, about 0.1 ms; torch.save
# makes ~40 small writes per tensor around each storage's one large one). Larger writes go
# as they are, no copy.
SMALL_WRITE_BYTES = 64 * 1024
GATHERED_BYTES_MAX = 1 << 20
# The same for reads: a read smaller than this fetches this much around its offset once, and
# the reads after it inside those bytes are answered here (torch.load's zip reader makes ~20 small
# reads around each record's header and end before one large read of its bytes).
READ_WINDOW_BYTES = 64 * 1024


class CairnFile(io.RawIOBase):
    """A file open through fsspec: reads and writes go to the namespace's FileHandle.

    As for a file on a local disk, `flush()` hands what was written to the file (other readers
    in this process see it, the write-behind sends it) and `fsync()` makes it durable on the
    cluster; `close()` is durable too. DCP calls `flush()` after every item it writes, so
    a durable flush there would drain the write-behind 256 times per GiB."""

    def __init__(self, filesystem, handle, mode, path):
        super().__init__()
        self.fs = filesystem
        self.handle = handle
        self.mode = mode
        self.path = path
        self._gathered = bytearray()        # small writes not yet handed over, from position
        self._window, self._window_at = b"", 0      # bytes read ahead for small reads, where

    def readable(self):
        return "r" in self.mode or "+" in self.mode

    def writable(self):
        return self.handle.writable

    def seekable(self):
        return True

    def _hand_over(self):
        """Give the gathered small writes to the handle (at its position)."""
        if self._gathered:
            data, self._gathered, self._window = bytes(self._gathered), bytearray(), b""
            self.fs._call(self.handle.write(data))

    def _from_window(self, size):
        """The next `size` bytes if a small read can have them from the window (else None),
        fetching a new window when the position is outside it."""
        if self._gathered or not 0 <= size < READ_WINDOW_BYTES:
            return None
        position = self.handle.position
        lo = position - self._window_at
        if not (0 <= lo and lo + size <= len(self._window)):
            # Centred on the position: a zip reader also walks backwards from a record's end.
            start = max(0, position - READ_WINDOW_BYTES // 2)
            window = self.fs._call(self.handle.read(READ_WINDOW_BYTES, offset=start))
            self._window, self._window_at, lo = window, start, position - start
            if lo + size > len(window):
                return None
        data = self._window[lo:lo + size]
        self.handle.position += len(data)
        return data

    def readinto(self, buffer):
        view = memoryview(buffer).cast("B")
        data = self._from_window(len(view))
        if data is not None:
            view[:len(data)] = data
            return len(data)
        self._hand_over()
        return self.fs._call(self.handle.read_into(view))

    def read(self, size=-1):
        data = self._from_window(-1 if size is None else size)
        if data is not None:
            return bytes(data)
        self._hand_over()
        return self.fs._call(self.handle.read(size))

    def readall(self):
        return self.read(-1)

    def write(self, data):
        size = memoryview(data).nbytes
        if size < SMALL_WRITE_BYTES and self.handle.writable:
            if len(self._gathered) + size > GATHERED_BYTES_MAX:
                self._hand_over()
            self._gathered += data
            return size
        self._hand_over()
        self._window = b""                  # (the bytes read around a small read may change)
        return self.fs._call(self.handle.write(data))

    def seek(self, offset, whence=io.SEEK_SET):
        self._hand_over()
        if whence == io.SEEK_SET:
            self.handle.position = offset
        elif whence == io.SEEK_CUR:
            self.handle.position += offset
        else:
            self.handle.position = self.handle.size + offset
        return self.handle.position

    def tell(self):
        return self.handle.position + len(self._gathered)

    def truncate(self, size=None):
        self._hand_over()
        self._window = b""
        size = self.handle.position if size is None else size
        self.fs._call(self.handle.truncate(size))
        return size

    def flush(self):
        if not self.closed:
            self._hand_over()

    def fsync(self):
        """Durable on the cluster when it returns (every byte written and the size)."""
        self._hand_over()
        if self.handle.writable:
            self.fs._call(self.handle.flush())

    def close(self):
        if not self.closed:
            try:
                try:
                    self._hand_over()
                finally:
                    self.fs._call(self.handle.close())  # durable on the cluster on return
            finally:
                super().close()

    @property
    def size(self):
        if not self._gathered:
            return self.handle.size
        return max(self.handle.size, self.tell())   # the gathered writes extend it
