# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""A small io_uring ring for asyncio: queue management and completion reaping in C.

Theory of operation:
- `Ring(depth)` owns one io_uring instance and one eventfd registered with it. The asyncio shell
  (`blockdev.UringBlockDevice`) watches the eventfd with `loop.add_reader` and calls `complete()`
  when it fires: no thread per operation, no busy polling.
- `queue_*()` records an operation with its future in C-visible state and places it in the
  submission queue if fewer than `depth` operations are in flight, else in a FIFO backlog. Nothing
  enters the kernel until `submit()`, which the shell calls once per loop turn, so one syscall
  carries every operation queued during that turn.
- `complete()` reaps every completion, resolves the futures (result: the byte count; failure: the
  exception that `error_factory(op, errno, offset, length)` builds), then moves backlog into the
  freed slots and submits them.
- Every operation keeps a reference to its buffer until its completion is reaped, so a cancelled
  future never lets the kernel write into freed memory.

Arguments are checked here, at the edge (alignment, lengths); the loops below trust them.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyBUF_WRITABLE
from libc.stdint cimport uint64_t, uint32_t, int32_t, uintptr_t
from libc.errno cimport errno
from posix.unistd cimport read, close
from collections import deque

from cairn.native.errors import DeviceGone, describe_uring_failure


cdef extern from "sys/eventfd.h":
    int eventfd(unsigned int initval, int flags)
    int EFD_NONBLOCK
    int EFD_CLOEXEC

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
    void io_uring_queue_exit(io_uring *ring)
    io_uring_sqe *io_uring_get_sqe(io_uring *ring)
    void io_uring_prep_read(io_uring_sqe *sqe, int fd, void *buf, unsigned nbytes, uint64_t offset)
    void io_uring_prep_write(io_uring_sqe *sqe, int fd, const void *buf, unsigned nbytes,
                             uint64_t offset)
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


cdef class _Op:
    cdef int code
    cdef int fd
    cdef uint64_t offset
    cdef uint64_t length
    cdef object future
    cdef Py_buffer view
    cdef bint has_view

    def __dealloc__(self):
        if self.has_view:
            PyBuffer_Release(&self.view)


cdef class Ring:
    """One io_uring instance with an eventfd; see the module docstring."""

    cdef io_uring ring
    cdef bint open
    cdef readonly int eventfd
    cdef readonly unsigned depth
    cdef readonly unsigned inflight
    cdef readonly uint64_t submitted_total
    cdef readonly uint64_t completed_total
    cdef unsigned queued            # in the SQ, not yet submitted
    cdef uint64_t next_id
    cdef dict ops                   # user_data -> _Op, for everything in the SQ or in flight
    cdef object backlog             # deque of _Op waiting for a free slot
    cdef object error_factory
    cdef readonly unsigned align

    def __cinit__(self, unsigned depth, error_factory, unsigned align=4096):
        self.open = False
        if depth < 1 or depth > 4096:
            raise ValueError(f"queue depth must be within 1..4096 (was {depth})")
        if align == 0 or (align & (align - 1)) != 0:
            raise ValueError(f"alignment must be a power of two (was {align})")
        cdef int rc = io_uring_queue_init(depth, &self.ring, 0)
        if rc < 0:
            raise describe_uring_failure(rc)
        self.eventfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.eventfd < 0:
            io_uring_queue_exit(&self.ring)
            raise OSError(errno, "eventfd failed")
        rc = io_uring_register_eventfd(&self.ring, self.eventfd)
        if rc < 0:
            close(self.eventfd)
            io_uring_queue_exit(&self.ring)
            raise describe_uring_failure(rc)
        self.open = True
        self.depth = depth
        self.align = align
        self.ops = {}
        self.backlog = deque()
        self.error_factory = error_factory
        self.next_id = 1

    def __dealloc__(self):
        if self.open:
            close(self.eventfd)
            io_uring_queue_exit(&self.ring)

    def close(self):
        """Fail every queued or in-flight operation with DeviceGone and release the ring.

        The caller must make sure nothing is in flight in the kernel (it waits for completions
        first); operations still in the backlog never reached the kernel."""
        if not self.open:
            return
        cdef _Op op
        while self.backlog:
            op = self.backlog.popleft()
            if not op.future.done():
                op.future.set_exception(DeviceGone("the device was closed with this operation "
                                                   "still queued", offset=op.offset,
                                                   length=op.length))
        self.open = False
        close(self.eventfd)
        io_uring_queue_exit(&self.ring)

    @property
    def backlog_count(self):
        return len(self.backlog)

    cdef _Op _new_op(self, int code, int fd, uint64_t offset, uint64_t length, future):
        if not self.open:
            raise DeviceGone("the io_uring ring is closed", offset=offset, length=length)
        cdef _Op op = _Op.__new__(_Op)
        op.code = code
        op.fd = fd
        op.offset = offset
        op.length = length
        op.future = future
        op.has_view = False
        return op

    cdef _attach_buffer(self, _Op op, buffer, bint writable):
        flags = PyBUF_WRITABLE if writable else PyBUF_SIMPLE
        PyObject_GetBuffer(buffer, &op.view, flags)
        op.has_view = True
        cdef uintptr_t address = <uintptr_t>op.view.buf
        op.length = op.view.len
        if address % self.align != 0 or op.view.len % self.align != 0 \
                or op.offset % self.align != 0:
            # The same error the kernel's EINVAL would give, naming the device (errno.EINVAL).
            raise self.error_factory(OP_NAMES[op.code], 22, op.offset, op.length)

    def queue_read(self, int fd, buffer, uint64_t offset, future):
        """Queue a read filling all of `buffer` (writable, aligned) from `offset`."""
        cdef _Op op = self._new_op(OP_READ, fd, offset, 0, future)
        self._attach_buffer(op, buffer, True)
        self._enqueue(op)

    def queue_write(self, int fd, buffer, uint64_t offset, future):
        """Queue a write of all of `buffer` (aligned) at `offset`."""
        cdef _Op op = self._new_op(OP_WRITE, fd, offset, 0, future)
        self._attach_buffer(op, buffer, False)
        self._enqueue(op)

    def queue_flush(self, int fd, future):
        """Queue an fdatasync: every write completed before it is durable when it completes."""
        self._enqueue(self._new_op(OP_FLUSH, fd, 0, 0, future))

    def queue_discard(self, int fd, uint64_t offset, uint64_t length, future):
        """Queue a discard (fallocate PUNCH_HOLE|KEEP_SIZE; a block device turns it into a
        discard or a zero-out)."""
        if offset % self.align != 0 or length % self.align != 0:
            raise self.error_factory("discard", 22, offset, length)
        self._enqueue(self._new_op(OP_DISCARD, fd, offset, length, future))

    cdef _enqueue(self, _Op op):
        if self.inflight + self.queued < self.depth and not self.backlog:
            self._place(op)
        else:
            self.backlog.append(op)

    cdef _place(self, _Op op):
        cdef io_uring_sqe *sqe = io_uring_get_sqe(&self.ring)
        assert sqe != NULL, "submission queue full although below depth"
        if op.code == OP_READ:
            io_uring_prep_read(sqe, op.fd, op.view.buf, <unsigned>op.length, op.offset)
        elif op.code == OP_WRITE:
            io_uring_prep_write(sqe, op.fd, op.view.buf, <unsigned>op.length, op.offset)
        elif op.code == OP_FLUSH:
            io_uring_prep_fsync(sqe, op.fd, IORING_FSYNC_DATASYNC)
        else:
            io_uring_prep_fallocate(sqe, op.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                    <long>op.offset, <long>op.length)
        cdef uint64_t user_data = self.next_id
        self.next_id += 1
        io_uring_sqe_set_data64(sqe, user_data)
        self.ops[user_data] = op
        self.queued += 1

    def submit(self):
        """Hand every queued submission to the kernel in one syscall; returns how many."""
        if not self.open or self.queued == 0:
            return 0
        cdef int rc = io_uring_submit(&self.ring)
        if rc < 0:
            # EAGAIN/EBUSY: the kernel is short of resources; what stays queued goes next time.
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
        cdef _Op op
        cdef int32_t res
        while True:
            count = io_uring_peek_batch_cqe(&self.ring, cqes, REAP_BATCH)
            if count == 0:
                break
            for i in range(count):
                op = self.ops.pop(cqes[i].user_data)
                res = cqes[i].res
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
        if future.done():           # cancelled by its waiter; the buffer is released now
            return
        if res < 0:
            future.set_exception(self.error_factory(OP_NAMES[op.code], -res, op.offset,
                                                    op.length))
        else:
            future.set_result(res)
