# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A small io_uring ring for asyncio: queueing, checking and completion reaping in C.

Theory of operation:
- `Ring(fd, size_bytes, depth, loop, ...)` owns one io_uring instance for one open file
  descriptor and one eventfd registered with it. The asyncio shell (`blockdev.UringBlockDevice`)
  watches the eventfd with `loop.add_reader` and calls `complete()` when it fires: no thread per
  operation, no busy polling.
- `read()`, `write()`, `flush()` and `discard()` check the request (range, alignment), record it
  with a fresh future and place it in the submission queue if fewer than `depth` operations are
  in flight, else in a FIFO backlog; they return the future. `read_then()` is `read()` with a
  callback instead of a future, called from `complete()` itself: a future's result reaches its
  waiter through `call_soon` one loop iteration later (about 3 us per op in all), which the
  OSD's callback-driven gets (osd/service.py `fast_get`) do not need. Nothing enters the
  kernel until the submission callback that the first request of a loop turn schedules with
  `loop.call_soon`, so one syscall carries every operation queued during that turn.
- `complete()` reaps every completion and resolves the futures (result: the byte count; failure:
  the exception that the `errors` object builds), then moves backlog into the freed slots and
  submits them.
- Every operation keeps a reference to its buffer (and the ring one to the operation, through the
  completion's user_data) until its completion is reaped, so a cancelled future never lets the
  kernel write into freed memory.

Why the checks live here and not in Python: at 4 KiB the per-operation Python cost is the
bottleneck (the kernel's own work is about 5 us per op on these machines), so the fast path stays
in C and Python code runs only to build an error.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport uint64_t, uint32_t, int32_t, uintptr_t
from libc.string cimport memset
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC
from libc.errno cimport errno
from posix.unistd cimport read, close
from collections import deque

from cairn.native.errors import DeviceGone, describe_uring_failure


cdef extern from "sys/eventfd.h":
    int eventfd(unsigned int initval, int flags)
    int EFD_NONBLOCK
    int EFD_CLOEXEC

cdef extern from "sys/uio.h" nogil:
    struct iovec:
        void *iov_base
        size_t iov_len

cdef extern from "liburing.h" nogil:
    struct io_uring:
        unsigned flags
        int ring_fd
    struct io_uring_sqe:
        pass
    struct io_uring_cqe:
        uint64_t user_data
        int32_t res
        uint32_t flags
    int io_uring_queue_init(unsigned entries, io_uring *ring, unsigned flags)
    unsigned IORING_SETUP_COOP_TASKRUN
    unsigned IORING_SETUP_SINGLE_ISSUER
    void io_uring_queue_exit(io_uring *ring)
    io_uring_sqe *io_uring_get_sqe(io_uring *ring)
    void io_uring_prep_read(io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes, uint64_t offset)
    void io_uring_prep_write(io_uring_sqe *sqe, int fd, const void *buf, unsigned nbytes,
                             uint64_t offset)
    void io_uring_prep_read_fixed(io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes,
                                  uint64_t offset, int buf_index)
    void io_uring_prep_write_fixed(io_uring_sqe *sqe, int fd, const void *buf, unsigned nbytes,
                                   uint64_t offset, int buf_index)
    int io_uring_register_buffers_sparse(io_uring *ring, unsigned nr)
    int io_uring_register_buffers_update_tag(io_uring *ring, unsigned off, const iovec *iovecs,
                                             const uint64_t *tags, unsigned nr)
    void io_uring_prep_fsync(io_uring_sqe *sqe, int fd, unsigned fsync_flags)
    void io_uring_prep_fallocate(io_uring_sqe *sqe, int fd, int mode, long offset, long len)
    void io_uring_sqe_set_data64(io_uring_sqe *sqe, uint64_t data)
    int io_uring_submit(io_uring *ring)
    unsigned io_uring_peek_batch_cqe(io_uring *ring, io_uring_cqe **cqes, unsigned count)
    void io_uring_cq_advance(io_uring *ring, unsigned nr)
    int io_uring_register_eventfd(io_uring *ring, int fd)
    unsigned IORING_FSYNC_DATASYNC

cdef extern from "linux/falloc.h":
    int FALLOC_FL_PUNCH_HOLE
    int FALLOC_FL_KEEP_SIZE

# Operation codes, also the names used in error messages.
DEF OP_READ = 0
DEF OP_WRITE = 1
DEF OP_FLUSH = 2
DEF OP_DISCARD = 3
OP_NAMES = ("read", "write", "flush", "discard")

DEF REAP_BATCH = 256

# Registered ("fixed") buffers: the kernel pins their pages once, at registration, instead of on
# every O_DIRECT operation (get_user_pages took 15% of a 4 MiB put bench's CPU, one call per 4 KiB
# page). The buffer pool's slabs are registered as they are made (native/bufpool.py); an
# operation whose buffer lies inside one uses READ_FIXED / WRITE_FIXED.
DEF FIXED_MAX = 64

# Latency histograms (native/latency.py holds the layout and the Python twin of the bucketing):
# [kind][size class][bucket], bucket = bit length of the latency in microseconds.
DEF KINDS = 4
DEF SIZE_CLASSES = 4
DEF BUCKETS = 26


cdef inline uint64_t _now_ns() nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000ULL + <uint64_t>ts.tv_nsec


cdef inline int _size_class(uint64_t length) nogil:
    if length <= 4096:
        return 0
    if length <= 65536:
        return 1
    if length <= 1048576:
        return 2
    return 3


cdef inline int _bucket(uint64_t latency_ns) nogil:
    cdef uint64_t us = latency_ns // 1000
    cdef int bits = 0
    while us:
        bits += 1
        us >>= 1
    return bits if bits < BUCKETS else BUCKETS - 1


cdef class _Op:
    cdef int code
    cdef uint64_t offset
    cdef uint64_t length
    cdef uint64_t placed_ns
    cdef object future              # None for an op with a callback
    cdef object then                # read_then's callback, called with None or the error
    cdef Py_buffer view
    cdef bint has_view

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)


cdef class Ring:
    """One io_uring instance for one file descriptor, with an eventfd; see the module docstring.

    `errors` builds the exceptions, so their messages can name the device:
    `errors.failed(op, errno, offset, length)` for an operation the kernel failed,
    `errors.short(op, count, offset, length)` for a short transfer and
    `errors.refused(op, reason, offset, length)` for a request refused before it reached the
    kernel (reason: "closed", "range" or "align")."""

    cdef io_uring ring
    cdef bint open
    cdef readonly bint accepting
    cdef readonly int fd
    cdef readonly int eventfd
    cdef readonly unsigned depth
    cdef readonly unsigned inflight
    cdef readonly unsigned setup_flags
    cdef readonly uint64_t size_bytes
    cdef readonly uint64_t submitted_total
    cdef readonly uint64_t completed_total
    cdef uint64_t[4] op_counts
    cdef uint64_t[2] byte_counts
    cdef uint64_t[KINDS * SIZE_CLASSES * BUCKETS] latency_counts
    cdef uint64_t[KINDS * SIZE_CLASSES] latency_sum_ns
    cdef uint64_t[KINDS * SIZE_CLASSES] latency_bytes
    cdef unsigned queued            # in the SQ, not yet submitted
    cdef bint submit_scheduled
    cdef object backlog             # deque of _Op waiting for a free slot
    cdef object errors
    cdef object create_future
    cdef object call_soon
    cdef object call_exception_handler
    cdef object submit_callback
    cdef readonly unsigned align
    cdef bint fixed_ok              # the kernel took a sparse table of FIXED_MAX buffers
    cdef readonly unsigned fixed_count
    cdef readonly uint64_t fixed_ops_total
    cdef uintptr_t[FIXED_MAX] fixed_start
    cdef uintptr_t[FIXED_MAX] fixed_end
    cdef object fixed_views         # the registered memory, kept alive while the ring lives

    def __cinit__(self, int fd, uint64_t size_bytes, unsigned depth, loop, errors,
                  unsigned align=4096):
        self.open = False
        self.accepting = False
        memset(self.latency_counts, 0, sizeof(self.latency_counts))
        memset(self.latency_sum_ns, 0, sizeof(self.latency_sum_ns))
        memset(self.latency_bytes, 0, sizeof(self.latency_bytes))
        if depth < 1 or depth > 4096:
            raise ValueError(f"queue depth must be within 1..4096 (was {depth})")
        if align == 0 or (align & (align - 1)) != 0:
            raise ValueError(f"alignment must be a power of two (was {align})")
        # COOP_TASKRUN: completions are posted when we next enter the kernel instead of by an
        # interrupt to our thread; SINGLE_ISSUER: only this thread submits. Both cut kernel work
        # per op; kernels before 6.0 refuse them, so fall back to no flags.
        cdef unsigned flags = IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER
        cdef int rc = io_uring_queue_init(depth, &self.ring, flags)
        if rc == -22:
            flags = 0
            rc = io_uring_queue_init(depth, &self.ring, flags)
        if rc < 0:
            raise describe_uring_failure(rc)
        self.setup_flags = flags
        self.eventfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.eventfd < 0:
            io_uring_queue_exit(&self.ring)
            raise OSError(errno, "eventfd failed")
        rc = io_uring_register_eventfd(&self.ring, self.eventfd)
        if rc < 0:
            close(self.eventfd)
            io_uring_queue_exit(&self.ring)
            raise describe_uring_failure(rc)
        # Kernels before 5.19 have no sparse table; without it every op pins its pages.
        self.fixed_ok = io_uring_register_buffers_sparse(&self.ring, FIXED_MAX) == 0
        self.fixed_views = []
        self.open = True
        self.accepting = True
        self.fd = fd
        self.size_bytes = size_bytes
        self.depth = depth
        self.align = align
        self.backlog = deque()
        self.errors = errors
        self.create_future = loop.create_future
        self.call_soon = loop.call_soon
        self.call_exception_handler = loop.call_exception_handler
        self.submit_callback = self._submit_soon

    def __dealloc__(self):
        if self.open:
            close(self.eventfd)
            io_uring_queue_exit(&self.ring)

    def stop_accepting(self):
        """Refuse new operations from now on (they raise the ESHUTDOWN error)."""
        self.accepting = False

    def close(self):
        """Fail every operation still in the backlog with DeviceGone and release the ring.

        The caller must make sure nothing is in flight in the kernel (it waits for completions
        first); operations still in the backlog never reached the kernel."""
        if not self.open:
            return
        cdef _Op op
        self.accepting = False
        while self.backlog:
            op = self.backlog.popleft()
            gone = DeviceGone("the device was closed with this operation still queued",
                              offset=op.offset, length=op.length)
            if op.then is not None:
                self._call_then(op, gone)
            elif not op.future.done():
                op.future.set_exception(gone)
        self.open = False
        close(self.eventfd)
        io_uring_queue_exit(&self.ring)
        self.fixed_count = 0
        self.fixed_views = []           # the kernel let go of them with the ring

    def register_region(self, buffer):
        """Register `buffer` (contiguous memory that stays mapped while the ring lives, such as
        a buffer pool slab) with the kernel, so operations on buffers inside it skip pinning
        pages each time. Returns False when it cannot be (no sparse table in this kernel, the
        table full, or locked memory over RLIMIT_MEMLOCK for an unprivileged user): operations
        there then work as before."""
        if not self.open or not self.fixed_ok or self.fixed_count >= FIXED_MAX:
            return False
        cdef Py_buffer view
        cdef iovec vec
        PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE)
        try:
            vec.iov_base = view.buf
            vec.iov_len = view.len
            if view.len == 0 or io_uring_register_buffers_update_tag(
                    &self.ring, self.fixed_count, &vec, NULL, 1) < 0:
                return False
            self.fixed_start[self.fixed_count] = <uintptr_t>view.buf
            self.fixed_end[self.fixed_count] = <uintptr_t>view.buf + <uintptr_t>view.len
        finally:
            PyBuffer_Release(&view)
        self.fixed_views.append(memoryview(buffer))
        self.fixed_count += 1
        return True

    cdef inline int _fixed_index(self, uintptr_t start, uint64_t length):
        cdef unsigned i
        for i in range(self.fixed_count):
            if self.fixed_start[i] <= start and start + length <= self.fixed_end[i]:
                return <int>i
        return -1

    @property
    def backlog_count(self):
        return len(self.backlog)

    def counters(self):
        """(ops by name, bytes by name) since the ring was made."""
        return ({"read": self.op_counts[OP_READ], "write": self.op_counts[OP_WRITE],
                 "flush": self.op_counts[OP_FLUSH], "discard": self.op_counts[OP_DISCARD]},
                {"read": self.byte_counts[OP_READ], "write": self.byte_counts[OP_WRITE]})

    def latency(self):
        """(counts, summed ns, bytes) of the latency histograms, as bytes of native uint64
        (native/latency.py `Snapshot.from_raw` reads them)."""
        return ((<char *>self.latency_counts)[:sizeof(self.latency_counts)],
                (<char *>self.latency_sum_ns)[:sizeof(self.latency_sum_ns)],
                (<char *>self.latency_bytes)[:sizeof(self.latency_bytes)])

    cdef _Op _new_op(self, int code, uint64_t offset, uint64_t length):
        cdef _Op op = _Op.__new__(_Op)
        op.code = code
        op.offset = offset
        op.length = length
        op.has_view = False
        return op

    cdef _refuse(self, int code, str reason, long long offset, long long length):
        raise self.errors.refused(OP_NAMES[code], reason, offset, length)

    cdef _check(self, int code, long long offset, long long length):
        if not self.accepting:
            self._refuse(code, "closed", offset, length)
        if offset < 0 or length < 0 or <uint64_t>(offset + length) > self.size_bytes:
            self._refuse(code, "range", offset, length)
        if offset % self.align != 0 or length % self.align != 0:
            self._refuse(code, "align", offset, length)

    cdef object _data_op(self, int code, long long offset, buffer, bint writable,
                         object then=None):
        cdef _Op op = _Op.__new__(_Op)
        op.then = then
        op.code = code
        op.has_view = False
        PyObject_GetBuffer(buffer, &op.view, PyBUF_WRITABLE if writable else PyBUF_SIMPLE)
        op.has_view = True
        op.length = op.view.len
        self._check(code, offset, op.view.len)
        op.offset = offset
        if <uintptr_t>op.view.buf % self.align != 0:
            self._refuse(code, "align", offset, op.length)
        return self._enqueue(op)

    def read(self, long long offset, buffer):
        """Read into all of `buffer` (writable, aligned) from `offset`; returns a future."""
        return self._data_op(OP_READ, offset, buffer, True)

    def read_then(self, long long offset, buffer, then):
        """`read()` without a future: `then(None)` once all of `buffer` is read, or
        `then(error)` with the exception `read()`'s future would hold, called from
        `complete()` (never from here: a bad request raises here, as `read()` does). An
        exception out of `then` goes to the event loop's exception handler; the other
        completions are still handled."""
        if then is None:
            raise TypeError("read_then needs a callback")
        self._data_op(OP_READ, offset, buffer, True, then)

    def write(self, long long offset, buffer):
        """Write all of `buffer` (aligned) at `offset`; returns a future."""
        return self._data_op(OP_WRITE, offset, buffer, False)

    def flush(self):
        """fdatasync: every write completed before it is durable when it completes."""
        self._check(OP_FLUSH, 0, 0)
        return self._enqueue(self._new_op(OP_FLUSH, 0, 0))

    def discard(self, long long offset, long long length):
        """Discard (fallocate PUNCH_HOLE|KEEP_SIZE; a block device turns it into a discard or a
        zero-out)."""
        self._check(OP_DISCARD, offset, length)
        return self._enqueue(self._new_op(OP_DISCARD, offset, length))

    cdef object _enqueue(self, _Op op):
        if op.then is None:
            op.future = self.create_future()
        self.op_counts[op.code] += 1
        if op.code <= OP_WRITE:
            self.byte_counts[op.code] += op.length
        if self.inflight + self.queued < self.depth and not self.backlog:
            self._place(op)
        else:
            self.backlog.append(op)
        if not self.submit_scheduled:
            self.submit_scheduled = True
            self.call_soon(self.submit_callback)
        return op.future

    cdef _place(self, _Op op):
        cdef io_uring_sqe *sqe = io_uring_get_sqe(&self.ring)
        assert sqe != NULL, "submission queue full although below depth"
        cdef int fixed = -1
        if op.code <= OP_WRITE and self.fixed_count:
            fixed = self._fixed_index(<uintptr_t>op.view.buf, op.length)
            if fixed >= 0:
                self.fixed_ops_total += 1
        if op.code == OP_READ:
            if fixed >= 0:
                io_uring_prep_read_fixed(sqe, self.fd, op.view.buf, <unsigned>op.length,
                                         op.offset, fixed)
            else:
                io_uring_prep_read(sqe, self.fd, op.view.buf, <unsigned>op.length, op.offset)
        elif op.code == OP_WRITE:
            if fixed >= 0:
                io_uring_prep_write_fixed(sqe, self.fd, op.view.buf, <unsigned>op.length,
                                          op.offset, fixed)
            else:
                io_uring_prep_write(sqe, self.fd, op.view.buf, <unsigned>op.length, op.offset)
        elif op.code == OP_FLUSH:
            io_uring_prep_fsync(sqe, self.fd, IORING_FSYNC_DATASYNC)
        else:
            io_uring_prep_fallocate(sqe, self.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                    <long>op.offset, <long>op.length)
        # The completion carries the operation's address; the ring owns one reference to it
        # until that completion is reaped.
        Py_INCREF(op)
        io_uring_sqe_set_data64(sqe, <uint64_t><uintptr_t><PyObject *>op)
        op.placed_ns = _now_ns()
        self.queued += 1

    def _submit_soon(self):
        self.submit_scheduled = False
        self.submit()

    def submit(self):
        """Hand every queued submission to the kernel in one syscall; returns how many."""
        if not self.open or self.queued == 0:
            return 0
        cdef int rc = io_uring_submit(&self.ring)
        if rc < 0:
            # EAGAIN/EBUSY: the kernel is short of resources; what stays queued goes next time.
            if not self.submit_scheduled:
                self.submit_scheduled = True
                self.call_soon(self.submit_callback)
            return 0
        self.queued -= rc
        self.inflight += rc
        self.submitted_total += rc
        return rc

    def complete(self):
        """Reap every completion, resolve futures, refill from the backlog and submit.

        Returns the number of completions reaped."""
        if not self.open:
            return 0
        cdef uint64_t counter
        read(self.eventfd, &counter, sizeof(counter))   # reset the eventfd; EAGAIN is fine
        cdef io_uring_cqe *cqes[REAP_BATCH]
        cdef unsigned count, i
        cdef unsigned total = 0
        cdef PyObject *raw
        cdef _Op op
        cdef int32_t res
        cdef uint64_t now
        cdef int cell
        while True:
            count = io_uring_peek_batch_cqe(&self.ring, cqes, REAP_BATCH)
            if count == 0:
                break
            now = _now_ns()
            for i in range(count):
                raw = <PyObject *><uintptr_t>cqes[i].user_data
                op = <_Op>raw
                Py_DECREF(op)           # the ring's reference; `op` holds its own
                res = cqes[i].res
                cell = op.code * SIZE_CLASSES + _size_class(op.length)
                self.latency_counts[cell * BUCKETS + _bucket(now - op.placed_ns)] += 1
                self.latency_sum_ns[cell] += now - op.placed_ns
                self.latency_bytes[cell] += op.length
                self._resolve(op, res)
            io_uring_cq_advance(&self.ring, count)
            self.inflight -= count
            self.completed_total += count
            total += count
        while self.backlog and self.inflight + self.queued < self.depth:
            self._place(self.backlog.popleft())
        self.submit()
        return total

    cdef _resolve(self, _Op op, int32_t res):
        future = op.future
        if op.has_view:
            PyBuffer_Release(&op.view)
            op.has_view = False
        if op.then is None and future.done():   # cancelled by its waiter; buffer released now
            return
        error = None
        if res < 0:
            error = self.errors.failed(OP_NAMES[op.code], -res, op.offset, op.length)
        elif op.code <= OP_WRITE and <uint64_t>res != op.length:
            error = self.errors.short(OP_NAMES[op.code], res, op.offset, op.length)
        if op.then is not None:
            self._call_then(op, error)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(res)

    cdef _call_then(self, _Op op, error):
        then, op.then = op.then, None
        try:
            then(error)
        except BaseException as exc:
            self.call_exception_handler({"message": "an io_uring read's callback failed",
                                         "exception": exc})
