"""python pairs.py TARGET ADDR CALLERS PAIRS SECS

The Python arms of bench/clients/run.sh: acquire+release pairs, try-once,
each caller on its own lock name. TARGET:

  tumbler        tumbler_client.Client (its default transport: Connect, binary
                 proto over kept-alive HTTP/1.1), CALLERS threads share it
  tumbler-async  tumbler_client.AsyncClient (the same over asyncio), CALLERS tasks share it
  tumbler-grpc, tumbler-grpc-async   the same with transport="grpc" (grpcio, grpc.aio)
  redis          redis.Redis (redis-py), CALLERS threads share its pool
  redis-async    redis.asyncio.Redis, CALLERS tasks share its pool

The plain Redis lock is what redis-py users write: SET key token NX PX ttl,
then compare-and-delete with a registered script (EVALSHA). A warm-up of
20 pairs per caller, then up to PAIRS pairs in all, cut at SECS seconds.
Prints "pairs=N secs=S"; a pair not granted and released fails the run.
"""
import asyncio
import os
import sys
import threading
import time
import uuid

TTL_MS = 10_000
UNLOCK = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0"


def shares(total, callers):
    return [total // callers + (1 if i < total % callers else 0) for i in range(callers)]


def name_of(caller):
    return f"bench-python-{os.getpid()}-{caller}"


def run_threads(pair, callers, total, deadline):
    done, errors = [0] * callers, []

    def caller(i, n):
        name = name_of(i)
        try:
            for _ in range(n):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                pair(name)
                done[i] += 1
        except Exception as e:  # reported, and the run fails
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i, n)) for i, n in enumerate(shares(total, callers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(done)


async def run_tasks(pair, callers, total, deadline):
    done = [0] * callers

    async def caller(i, n):
        name = name_of(i)
        for _ in range(n):
            if deadline is not None and time.monotonic() >= deadline:
                break
            await pair(name)
            done[i] += 1

    await asyncio.gather(*(caller(i, n) for i, n in enumerate(shares(total, callers))))
    return sum(done)


def measure_sync(pair, callers, pairs, secs):
    run_threads(pair, callers, 20 * callers, None)
    start = time.monotonic()
    done = run_threads(pair, callers, pairs, start + secs)
    return done, time.monotonic() - start


async def measure_async(pair, callers, pairs, secs):
    await run_tasks(pair, callers, 20 * callers, None)
    start = time.monotonic()
    done = await run_tasks(pair, callers, pairs, start + secs)
    return done, time.monotonic() - start


def main():
    target, addr, callers, pairs, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    host, port = addr.rsplit(":", 1)
    transport = "grpc" if target.startswith("tumbler-grpc") else "auto"
    target = target.replace("tumbler-grpc", "tumbler")
    if target == "tumbler":
        from tumbler_client import Client
        client = Client(addr, transport=transport)

        def pair(name):
            lock = client.acquire(name, ttl_ms=TTL_MS)
            if not lock.release():
                raise RuntimeError(f"release {name}: not held")

        result = measure_sync(pair, callers, pairs, secs)
    elif target == "tumbler-async":
        from tumbler_client import AsyncClient

        async def go():
            async with AsyncClient(addr, transport=transport) as client:
                async def pair(name):
                    lock = await client.acquire(name, ttl_ms=TTL_MS)
                    if not await lock.release():
                        raise RuntimeError(f"release {name}: not held")

                return await measure_async(pair, callers, pairs, secs)

        result = asyncio.run(go())
    elif target == "redis":
        import redis
        r = redis.Redis(host=host, port=int(port), max_connections=max(callers, 2))
        unlock = r.register_script(UNLOCK)

        def pair(name):
            token = uuid.uuid4().hex
            if not r.set(name, token, nx=True, px=TTL_MS):
                raise RuntimeError(f"SET {name}: not acquired")
            if unlock(keys=[name], args=[token]) != 1:
                raise RuntimeError(f"unlock {name}: not held")

        result = measure_sync(pair, callers, pairs, secs)
    elif target == "redis-async":
        import redis.asyncio as aredis

        async def go():
            r = aredis.Redis(host=host, port=int(port), max_connections=max(callers, 2))
            unlock = r.register_script(UNLOCK)

            async def pair(name):
                token = uuid.uuid4().hex
                if not await r.set(name, token, nx=True, px=TTL_MS):
                    raise RuntimeError(f"SET {name}: not acquired")
                if await unlock(keys=[name], args=[token]) != 1:
                    raise RuntimeError(f"unlock {name}: not held")

            try:
                return await measure_async(pair, callers, pairs, secs)
            finally:
                await r.aclose()

        result = asyncio.run(go())
    else:
        sys.exit(f"unknown target {target}")
    print(f"pairs={result[0]} secs={result[1]:.6f}")


if __name__ == "__main__":
    main()
