package tumbler.client;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A held grant (or a multi-lock's set of grants) with its watchdog: a guard for try-with-resources.
 *
 * <p>While it is open, the watchdog extends the lease (pinned to the fencing token) each third of it. The lease is
 * counted from the <em>send</em> time of the request that was granted it, never from when the answer arrived, so
 * {@link #isHeld()} never says "held" after the server's lease ended. The lock is <em>lost</em> when an extend
 * answers NOT_HELD (an admin's Clear, a release with its token, a reap) or the lease runs out before a renewal (the
 * server unreachable): {@link #isLost()} turns true, the {@link #onLost} listeners are called once (on a watchdog
 * thread), and {@link #check()} and {@link #close()} throw {@link LockLostException}.
 */
public class HeldLock implements AutoCloseable {
    final TumblerClient client;
    final String name;
    final List<String> names;
    final String namespace;
    final Integer limit;
    final String kind;
    private volatile List<Grant> grants;
    private volatile long ttlMs;
    private volatile long renewedNanos;
    private volatile long expiresNanos;
    private volatile boolean released;
    private volatile boolean lost;
    private volatile String lostReason;
    private final List<Consumer<LockLostException>> listeners = new CopyOnWriteArrayList<>();
    private ScheduledFuture<?> renewal;
    private ScheduledFuture<?> expiry;
    private boolean watchdog = true;

    HeldLock(TumblerClient client, String name, List<String> names, List<Grant> grants, String namespace,
             Integer limit, String kind) {
        this.client = client;
        this.name = name;
        this.names = names;
        this.grants = grants;
        this.namespace = namespace;
        this.limit = limit;
        this.kind = kind;
        Grant g = grants.get(0);
        this.ttlMs = g.ttlMs() > 0 ? g.ttlMs() : Math.max(1, g.expiresAtMs() - g.acquiredAtMs());
    }

    /**
     * Counts the lease from the request's start ({@code start}, System.nanoTime before it was sent). A grant made
     * during the call began no earlier than the call's start, so its lease ends no earlier than start + lease. That
     * holds for every grant when the holder was made for this call (an already-held answer is then an earlier try's
     * grant whose answer was lost), and for a new grant otherwise, unless a read request downgraded the holder's
     * write grant (same lease). Any other grant may be older, with a lease the answer does not date: it is renewed
     * once and counted from that renewal's start. So is a grant whose call took more than a quarter of its lease.
     */
    HeldLock countLease(long start, boolean madeHere) {
        long leaseMs = Long.MAX_VALUE;
        boolean newGrant = true;
        for (Grant g : grants) {
            long l = g.expiresAtMs() > 0 && g.acquiredAtMs() > 0 ? g.expiresAtMs() - g.acquiredAtMs() : g.ttlMs();
            leaseMs = Math.min(leaseMs, l);
            if (g.alreadyHeld() || g.mode() == LockMode.READ) newGrant = false;
        }
        long tookMs = (System.nanoTime() - start) / 1_000_000;
        if ((!madeHere && !newGrant) || tookMs > leaseMs / 4) {
            expiresNanos = System.nanoTime() + ttlMs * 1_000_000;
            renewedNanos = System.nanoTime();
            try {
                extend();
            } catch (RuntimeException e) {
                if (!lost) lose("lease ran out before a renewal: " + e.getMessage());
                throw e;
            }
            return this;
        }
        leased(start, leaseMs);
        schedule();
        return this;
    }

    /** A lease of leaseMs granted by a request sent at start; the server stamps whole ms, hence 1 ms less. */
    private void leased(long start, long leaseMs) {
        renewedNanos = start;
        expiresNanos = start + (leaseMs - 1) * 1_000_000;
    }

    /** The next renewal at a third of the lease, and the lease's end, which counts it lost unless renewed. */
    private synchronized void schedule() {
        if (released || lost || client.timer.isShutdown()) return;
        if (renewal != null) renewal.cancel(false);
        if (expiry != null) expiry.cancel(false);
        long now = System.nanoTime();
        if (watchdog) {
            long at = renewedNanos + ttlMs * 1_000_000 / 3 - now;
            renewal = client.timer.schedule(() -> client.workers.execute(this::renew), Math.max(0, at),
                    TimeUnit.NANOSECONDS);
        }
        expiry = client.timer.schedule(() -> client.workers.execute(this::isLost), Math.max(0, expiresNanos - now),
                TimeUnit.NANOSECONDS);
    }

    /** The watchdog's renewal; a failure that leaves lease is tried again soon. */
    private void renew() {
        if (released || lost) return;
        try {
            extend();
        } catch (LockLostException e) {
            // lost: the listeners were told
        } catch (RuntimeException e) {
            if (released || isLost()) return;
            synchronized (this) {
                if (renewal != null) renewal.cancel(false);
                long retry = Math.min(ttlMs / 10, 250);
                if (!client.timer.isShutdown()) {
                    renewal = client.timer.schedule(() -> client.workers.execute(this::renew), Math.max(10, retry),
                            TimeUnit.MILLISECONDS);
                }
            }
        }
    }

    /** Turns the watchdog off (or on again): the lease then ends unless you call {@link #extend()}. */
    public HeldLock watchdog(boolean on) {
        synchronized (this) {
            watchdog = on;
            if (!on && renewal != null) renewal.cancel(false);
        }
        schedule();
        return this;
    }

    void lose(String reason) {
        synchronized (this) {
            if (lost) return;
            if (released) { // a resigned leadership told its term is over: lost, with no one left to tell
                lost = true;
                lostReason = reason;
                return;
            }
            lost = true;
            lostReason = reason;
            if (renewal != null) renewal.cancel(false);
            if (expiry != null) expiry.cancel(false);
        }
        LockLostException e = lostException();
        for (Consumer<LockLostException> l : listeners) {
            try {
                l.accept(e);
            } catch (RuntimeException ignored) {
                // a listener's failure is its own
            }
        }
    }

    LockLostException lostException() {
        return new LockLostException("lost", "check", label() + ": lock lost (fencing token " + fencingToken() + "): "
                + lostReason, lostReason);
    }

    String label() {
        return names != null ? String.join(",", names) : name;
    }

    // ---------------------------------------------------------------- what it holds

    /** The lock's name (null for a multi-lock's set: see {@link #names()}). */
    public String name() { return name; }
    /** A multi-lock's names in the order asked; a single lock's name as a one-element list. */
    public List<String> names() { return names != null ? names : List.of(name); }
    public String holder() { return grants.get(0).holder(); }
    /** The grant (a set's first). */
    public Grant grant() { return grants.get(0); }
    /** Every grant: one per name of a multi-lock's set. */
    public List<Grant> grants() { return grants; }
    /** The fencing token (a set's first lock's): hand it to the resource you protect. */
    public long fencingToken() { return grants.get(0).fencingToken(); }
    /** One token per name, in the order of {@link #names()}. */
    public List<Long> fencingTokens() {
        List<Long> l = new ArrayList<>();
        for (Grant g : grants) l.add(g.fencingToken());
        return l;
    }
    public int slot() { return grants.get(0).slot(); }
    public List<Integer> slots() { return grants.get(0).slots(); }
    public int permits() { return grants.get(0).permits(); }
    /** READ or WRITE for a read/write lock; null for a plain lock. */
    public LockMode mode() { return grants.get(0).mode(); }
    /** The lease length the watchdog renews. */
    public Duration ttl() { return Duration.ofMillis(ttlMs); }

    /** What is left of the lease by the local count (zero once it passed); the server's lease ends no earlier. */
    public Duration remaining() {
        long left = expiresNanos - System.nanoTime();
        return left > 0 ? Duration.ofNanos(left) : Duration.ZERO;
    }

    /** True until released or lost. */
    public boolean isHeld() {
        return !released && !isLost();
    }

    public boolean isReleased() {
        return released;
    }

    /** True once an extend answered NOT_HELD or the lease ran out before a renewal. */
    public boolean isLost() {
        if (!lost && !released && System.nanoTime() - expiresNanos >= 0) lose("lease ran out before a renewal");
        return lost;
    }

    /** Why it was lost; null while it is not. */
    public String lostReason() {
        return isLost() ? lostReason : null;
    }

    /** Called once when the lock is lost (at once if it is lost already), on a watchdog thread. */
    public HeldLock onLost(Consumer<LockLostException> listener) {
        listeners.add(listener);
        if (isLost() && listeners.remove(listener)) listener.accept(lostException());
        return this;
    }

    /** Throws {@link LockLostException} when the lock is lost. */
    public HeldLock check() {
        if (isLost()) throw lostException();
        return this;
    }

    // ---------------------------------------------------------------- acting on it

    /** Extends the lease by its own ttl now (the watchdog does this by itself). */
    public HeldLock extend() {
        return extend(null);
    }

    /**
     * Extends the lease to {@code ttl} from now (null: the grant's own), pinned to the token; the watchdog renews by
     * that from then on. Throws {@link LockLostException} (and the lock is lost) when the server no longer has it.
     */
    public HeldLock extend(Duration ttl) {
        check();
        if (released) throw new IllegalStateException(label() + ": released");
        long want = ttl != null ? ttl.toMillis() : ttlMs;
        long start = System.nanoTime();
        long left = expiresNanos - start;
        long timeout = Math.min(Math.max(left, 1_000_000), 10_000_000_000L);
        Grant renewed;
        try {
            renewed = extendCall(Duration.ofMillis(want), timeout);
        } catch (NotHeldException | NotLeaderException e) {
            lose(e.reason() != null ? e.reason() : "not held any more");
            throw lostException();
        } catch (UnavailableException e) {
            if (System.nanoTime() - expiresNanos >= 0) {
                lose("lease ran out before a renewal: " + e.getMessage());
                throw lostException();
            }
            throw e;
        }
        synchronized (this) {
            List<Grant> next = new ArrayList<>();
            for (Grant g : grants) next.add(g.withLease(renewed));
            grants = next;
            ttlMs = renewed.ttlMs() > 0 ? renewed.ttlMs() : want;
            leased(start, ttlMs + 1); // Extend: ttl from the server's now, which is after this request's start
        }
        schedule();
        return this;
    }

    Grant extendCall(Duration ttl, long timeoutNanos) {
        if (names != null) {
            return client.extend(null, names, holder(), ttl, null, fencingTokens(), namespace, timeoutNanos);
        }
        return client.extend(name, null, holder(), ttl, fencingToken(), null, namespace, timeoutNanos);
    }

    /**
     * A write grant becomes a read grant at once (same token, slot and lease; readers may then join). Throws
     * {@link FailedPreconditionException} on a plain lock, {@link LockLostException} when the grant is gone.
     */
    public HeldLock downgrade() {
        check();
        LockOptions o = new LockOptions().holder(holder()).mode(LockMode.READ).ttl(Duration.ofMillis(ttlMs))
                .namespace(namespace);
        if (limit != null) o.limit(limit);
        if (kind != null) o.kind(kind);
        Grant g;
        try {
            g = client.acquire(name, o);
        } catch (NotAcquiredException e) {
            lose("not held any more (downgrade found another holder)");
            throw lostException();
        }
        if (g.fencingToken() != fencingToken()) {
            client.release(name, null, holder(), g.fencingToken(), null, namespace, 2_000_000_000L);
            lose("not held any more (expired, released by another, cleared or reaped)");
            throw lostException();
        }
        grants = List.of(g);
        return this;
    }

    /** Releases (pinned to the token): true if this call released it, false if it was not held any more. */
    public boolean release() {
        synchronized (this) {
            if (released) return false;
            released = true;
            if (renewal != null) renewal.cancel(false);
            if (expiry != null) expiry.cancel(false);
        }
        if (lost) return false;
        return releaseCall();
    }

    boolean releaseCall() {
        long timeout = 5_000_000_000L;
        if (names != null) return client.release(null, names, holder(), null, fencingTokens(), namespace, timeout);
        return client.release(name, null, holder(), fencingToken(), null, namespace, timeout);
    }

    /**
     * Releases; throws {@link LockLostException} when the lock was lost while held (what it protected ran without
     * it). In try-with-resources, a body's own exception comes first and this one is added to it as suppressed.
     */
    @Override
    public void close() {
        boolean wasLost = !released && isLost();
        release();
        if (wasLost) throw lostException();
    }

    @Override
    public String toString() {
        return "HeldLock{" + label() + ", holder=" + holder() + ", token=" + fencingToken()
                + (lost ? ", lost: " + lostReason : released ? ", released" : "") + "}";
    }
}
