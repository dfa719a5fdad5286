package tumbler.client;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.TimeUnit;

/**
 * A semaphore of {@code limit} permits held in tumbler, as Redisson's {@code RPermitExpirableSemaphore}: each
 * acquire returns the permits it took as a {@link HeldLock} (its slots, its fencing token, its watchdog), released by
 * closing it, from any thread. Permits are taken k at a time ({@code acquire(3)}: golang's {@code
 * semaphore.Weighted}); a fair request that does not fit waits in the server's queue and is not passed by smaller
 * ones behind it.
 */
public final class TumblerSemaphore {
    private final TumblerClient client;
    private final String name;
    private final int limit;
    private final LockOptions options;

    TumblerSemaphore(TumblerClient client, String name, int limit, LockOptions options) {
        this.client = client;
        this.name = name;
        this.limit = limit;
        this.options = options;
        if (options.ttl == null) options.ttl = Duration.ofSeconds(30);
    }

    public String getName() { return name; }
    public int limit() { return limit; }

    private LockOptions with(int permits, Duration wait) {
        return options.copy().limit(limit).permits(permits).wait(wait).holder(null);
    }

    /** One permit, waiting as long as it takes. */
    public HeldLock acquire() {
        return acquire(1);
    }

    /** {@code permits} permits, waiting as long as it takes. */
    public HeldLock acquire(int permits) {
        while (true) {
            try {
                return client.held(name, null, with(permits, TumblerLock.WAIT_CHUNK), false);
            } catch (WaitTimeoutException e) {
                // ask again
            } catch (InterruptedException e) {
                throw new IllegalStateException(e);
            }
        }
    }

    /** {@code permits} permits, waiting; an interrupt stops the wait (the request leaves the queue). */
    public HeldLock acquireInterruptibly(int permits) throws InterruptedException {
        while (true) {
            try {
                return client.held(name, null, with(permits, TumblerLock.WAIT_CHUNK), true);
            } catch (WaitTimeoutException e) {
                // ask again
            }
        }
    }

    /** One permit if one is free now. */
    public Optional<HeldLock> tryAcquire() {
        return tryAcquire(1);
    }

    /** {@code permits} permits if they are free now (fair: and nobody waits first). */
    public Optional<HeldLock> tryAcquire(int permits) {
        try {
            return Optional.of(client.held(name, null, with(permits, Duration.ZERO), false));
        } catch (NotAcquiredException e) {
            return Optional.empty();
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    /** {@code permits} permits, waiting up to the time in the server's queue. */
    public Optional<HeldLock> tryAcquire(int permits, long time, TimeUnit unit) throws InterruptedException {
        try {
            return Optional.of(client.held(name, null, with(permits, Duration.ofNanos(unit.toNanos(time))), true));
        } catch (NotAcquiredException e) {
            return Optional.empty();
        }
    }

    /** The permits free now (limit less the permits live grants hold). */
    public int availablePermits() {
        return Math.max(0, limit - client.inspect(name).permitsInUse());
    }
}
