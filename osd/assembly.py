"""How an OSD's PG code is put together, in one place: the daemon (osd/daemon.py) and the seeded
simulation (tests/simnet.py) both call `assemble`, so the simulation runs the wiring that ships.

Who holds whom (docs/DESIGN.md): everything here reaches the world only through `port`
(osd/port.py); `LocalCopies` is shared by the backends, the registry and the service; the
service's op table answers calls the port routes to this OSD itself.
"""

import dataclasses

from cairn.osd.backend_erasure import ErasureBackend
from cairn.osd.backend_replicated import ReplicatedBackend
from cairn.osd.pglocal import LocalCopies
from cairn.osd.pgs import PgRegistry
from cairn.osd.scrubber import Scrubber
from cairn.osd.service import ObjectService


@dataclasses.dataclass(frozen=True)
class Parts:
    local: LocalCopies
    backends: dict              # pool kind -> PgBackend
    registry: PgRegistry
    service: ObjectService
    scrubber: Scrubber


def assemble(port, audit_op):
    """The PG code of one OSD over `port`; `audit_op(peer, header, result)` records a client
    write in the audit log."""
    local = LocalCopies(port)
    backends = {"replicated": ReplicatedBackend(port, local),
                "erasure": ErasureBackend(port, local)}
    registry = PgRegistry(port, local, backends)
    service = ObjectService(port, local, registry, backends, audit_op)
    scrubber = service.scrubber = Scrubber(port, registry, backends)
    port.local = service.handle
    return Parts(local, backends, registry, service, scrubber)
