"""python breakdown.py WHAT ADDR PAIRS [TRANSPORT]

Where a call of tumbler_client goes, beside bound.py's bare round trips
(issue 50 item 4). One caller, sequential acquire+release pairs as run.sh
makes them (try-once, lease 10 s), a warm-up of 200 pairs, then PAIRS.
TRANSPORT: auto (default: Connect for a plaintext client) or grpc. WHAT:

  own       the client's own Python per call: the same pairs with the
            transport replaced by one that answers at once with a
            canned reply (request building, holder ids, deadline
            arithmetic, retries' bookkeeping, Lock objects, reading
            the reply); ADDR is not contacted
  client    the real pairs: µs per call, and CPU (user+system) per call
            of this process
  cprofile  the real pairs under cProfile: the 15 functions with the
            most time of their own (own-cprofile: the canned ones)

Prints "WHAT TRANSPORT: N µs per call" (and the profile).
"""
import cProfile
import os
import pstats
import sys
import time

TTL_MS = 10_000


def main():
    what, addr, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    transport = sys.argv[4] if len(sys.argv) > 4 else "auto"
    from tumbler_client import Client, pb
    client = Client(addr, transport=transport)
    name = f"profile-py-{os.getpid()}"

    if what in ("own", "own-cprofile"):
        grant = pb.Grant(holder="h", fencing_token=1, slot=1, ttl_ms=TTL_MS, kind="default", permits=1)
        acquired = pb.AcquireResponse(status=pb.ACQUIRE_STATUS_ACQUIRED, grant=grant, holders=1)
        released = pb.ReleaseResponse(status=pb.RELEASE_STATUS_RELEASED)

        class Canned:
            def Acquire(self, request, timeout=None, metadata=None):
                request.SerializeToString()  # as a transport would
                return pb.AcquireResponse.FromString(acquired.SerializeToString())

            def Release(self, request, timeout=None, metadata=None):
                request.SerializeToString()
                return pb.ReleaseResponse.FromString(released.SerializeToString())
        client._unary = Canned()

    def pair():
        lock = client.acquire(name, ttl_ms=TTL_MS)
        if not lock.release():
            raise RuntimeError("not held")

    for _ in range(200):
        pair()
    if what.endswith("cprofile"):
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(n):
            pair()
        prof.disable()
        secs = time.perf_counter() - t0
        print(f"{what} {transport}: {secs / n / 2 * 1e6:.0f} µs per call (under the profiler)")
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
        return
    cpu0, t0 = os.times(), time.perf_counter()
    for _ in range(n):
        pair()
    secs, cpu1 = time.perf_counter() - t0, os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    print(f"{what} {transport}: {secs / n / 2 * 1e6:.0f} µs per call, {cpu / n / 2 * 1e6:.0f} µs CPU per call")


if __name__ == "__main__":
    main()
