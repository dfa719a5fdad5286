"""python bound.py MODE ADDR PAIRS

The floor under the Python client (issue 50 item 4): what one call costs
through Python's own transport libraries doing nothing else, against the
same server the client bench uses. One caller, sequential calls, a warm-up
of 200, then PAIRS of them. Prints "MODE: N µs per call". MODE:

  grpc-health     grpcio: an empty unary Health/Check (no Redis behind it)
  grpc-pairs      grpcio: Acquire + Release by the generated stub, requests
                  built once, no deadline, no metadata, nothing read
  aio-pairs       grpc.aio: the same as tasks of one event loop
  connect-pairs   Connect binary proto (application/proto) over one
                  kept-alive HTTP/1.1 socket (TCP_NODELAY, one write per
                  request), requests serialized once, answers parsed
  aconnect-pairs  the same over asyncio streams

A "call" is one acquire or one release (half a pair), as in run.sh.
Needs tumbler_client installed (for its generated messages) and grpcio.
"""
import asyncio
import socket
import sys
import time

TTL_MS = 10_000


def main():
    mode, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from tumbler_client import pb, pb_grpc
    acq = pb.AcquireRequest(name=f"bound-py-{mode}", holder="bound-py", ttl_ms=TTL_MS)
    rel = pb.ReleaseRequest(name=acq.name, holder="bound-py")

    def timed(one, count):
        for _ in range(200):
            one()
        t0 = time.perf_counter()
        for _ in range(count):
            one()
        return time.perf_counter() - t0

    if mode == "grpc-health":
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        ch = grpc.insecure_channel(addr)
        stub = health_pb2_grpc.HealthStub(ch)
        req = health_pb2.HealthCheckRequest()
        secs, calls = timed(lambda: stub.Check(req), n), n
    elif mode == "grpc-pairs":
        import grpc
        stub = pb_grpc.LockServiceStub(grpc.insecure_channel(addr))

        def pair():
            stub.Acquire(acq)
            stub.Release(rel)
        secs, calls = timed(pair, n), 2 * n
    elif mode == "aio-pairs":
        import grpc

        async def go():
            stub = pb_grpc.LockServiceStub(grpc.aio.insecure_channel(addr))
            for _ in range(200):
                await stub.Acquire(acq)
                await stub.Release(rel)
            t0 = time.perf_counter()
            for _ in range(n):
                await stub.Acquire(acq)
                await stub.Release(rel)
            return time.perf_counter() - t0
        secs, calls = asyncio.run(go()), 2 * n
    elif mode in ("connect-pairs", "aconnect-pairs"):
        host, port = addr.rsplit(":", 1)
        a_body, r_body = acq.SerializeToString(), rel.SerializeToString()

        def request(method, body):
            return (f"POST /tumbler.v1.LockService/{method} HTTP/1.1\r\nHost: {addr}\r\n"
                    f"Content-Type: application/proto\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        a_req, r_req = request("Acquire", a_body), request("Release", r_body)
        if mode == "connect-pairs":
            sock = socket.create_connection((host, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            buf = bytearray()

            def call(req, cls):
                nonlocal buf
                sock.sendall(req)
                while True:
                    end = buf.find(b"\r\n\r\n")
                    if end >= 0:
                        head = bytes(buf[:end]).lower()
                        i = head.index(b"content-length:") + 15
                        length = int(head[i:head.index(b"\r\n", i) if b"\r\n" in head[i:] else None])
                        if len(buf) >= end + 4 + length:
                            body = bytes(buf[end + 4:end + 4 + length])
                            del buf[:end + 4 + length]
                            return cls.FromString(body)
                    buf += sock.recv(65536)

            def pair():
                call(a_req, pb.AcquireResponse)
                call(r_req, pb.ReleaseResponse)
            secs, calls = timed(pair, n), 2 * n
        else:
            async def go():
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

                async def call(req, cls):
                    writer.write(req)
                    head = (await reader.readuntil(b"\r\n\r\n")).lower()
                    i = head.index(b"content-length:") + 15
                    length = int(head[i:head.index(b"\r\n", i)])
                    return cls.FromString(await reader.readexactly(length))

                async def pair():
                    await call(a_req, pb.AcquireResponse)
                    await call(r_req, pb.ReleaseResponse)
                for _ in range(200):
                    await pair()
                t0 = time.perf_counter()
                for _ in range(n):
                    await pair()
                return time.perf_counter() - t0
            secs, calls = asyncio.run(go()), 2 * n
    else:
        sys.exit(f"unknown mode {mode}")
    print(f"{mode}: {secs / calls * 1e6:.0f} µs per call")


if __name__ == "__main__":
    main()
