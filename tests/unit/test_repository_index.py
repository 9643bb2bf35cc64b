"""RepositoryIndex says which versions can answer now: not while the server drains."""

from __future__ import annotations

from grpc import aio

from protos import pb, pb_grpc
from tests.proxy.scripted import affine, serve


async def test_index_marks_versions_unavailable_while_draining() -> None:
    server = await serve(affine("a", 1.0, 0.0), affine("b", 2.0, 0.0))
    try:
        async with aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
            assert [(m.name, m.state) for m in index.models] == [("a", "READY"), ("b", "READY")]
            server.plane.draining = True
            index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
            assert {(m.state, m.reason) for m in index.models} == {("UNAVAILABLE", "shutting down")}
            ready = await stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=5)
            assert list(ready.models) == []
    finally:
        await server.stop(0)
