package tumbler.client;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;

/**
 * Leader election as Curator's {@code LeaderLatch}: {@link #start()} campaigns in the background (waiting in the
 * election's queue), {@link #hasLeadership()} and {@link #await} tell when this process leads, and the
 * {@link LeaderLatchListener}s hear it gain and lose it. A lost term (its lease ran out, an admin cleared it) is
 * told with {@code notLeader()}, and the latch campaigns again. {@link #close()} resigns (the next candidate is
 * elected at once) and stops.
 *
 * <p>{@link #leadership()} is the current term: its {@link Leadership#term()} is a fencing token for what the
 * leader writes, and {@link Leadership#proclaim} changes the value others see.
 */
public final class LeaderLatch implements AutoCloseable {
    private final TumblerClient client;
    private final String name;
    private final String value;
    private final String id;
    private final Duration ttl;
    private final List<LeaderLatchListener> listeners = new CopyOnWriteArrayList<>();
    private final Object lock = new Object();
    private volatile Leadership leadership;
    private volatile boolean closed;
    private volatile boolean started;
    private Thread thread;

    LeaderLatch(TumblerClient client, String name, String value, String id, Duration ttl) {
        this.client = client;
        this.name = name;
        this.value = value;
        this.id = id != null ? id : TumblerClient.newHolder();
        this.ttl = ttl;
    }

    /** The candidate id this latch campaigns as (the same for every campaign of it). */
    public String getId() { return id; }
    public String getName() { return name; }

    public LeaderLatch addListener(LeaderLatchListener listener) {
        listeners.add(listener);
        return this;
    }

    /** Starts campaigning on a thread of its own (once). */
    public LeaderLatch start() {
        synchronized (lock) {
            if (started) throw new IllegalStateException("already started");
            started = true;
            thread = new Thread(this::run, "tumbler-leader-latch-" + name);
            thread.setDaemon(true);
            thread.start();
        }
        return this;
    }

    private void run() {
        long pause = 50;
        while (!closed) {
            Leadership l = null;
            try {
                LockOptions o = new LockOptions().holder(id).ttl(ttl).wait(TumblerLock.WAIT_CHUNK);
                l = client.campaignInterruptibly(name, value, o).orElse(null);
                if (l == null) continue;
                pause = 50;
                synchronized (lock) {
                    leadership = l;
                    l.onLost(e -> {
                        synchronized (lock) {
                            lock.notifyAll();
                        }
                    });
                    lock.notifyAll();
                }
                tell(true);
                synchronized (lock) {
                    while (!closed && !l.isLost()) lock.wait(Math.max(1, ttl.toMillis() / 3));
                }
            } catch (InterruptedException e) {
                // closed
            } catch (TumblerException e) {
                try {
                    Thread.sleep(pause);
                } catch (InterruptedException ie) {
                    // closed
                }
                pause = Math.min(pause * 2, 1000);
            } finally {
                if (l != null) {
                    synchronized (lock) {
                        leadership = null;
                    }
                    if (closed && !l.isLost()) {
                        Thread.interrupted(); // the resign must be sent
                        try {
                            l.resign();
                        } catch (TumblerException e) {
                            // its lease ends by itself
                        }
                    }
                    tell(false);
                }
            }
        }
    }

    private void tell(boolean leads) {
        for (LeaderLatchListener l : listeners) {
            try {
                if (leads) l.isLeader();
                else l.notLeader();
            } catch (RuntimeException ignored) {
                // a listener's failure is its own
            }
        }
    }

    /** True while this latch leads (its term not lost). */
    public boolean hasLeadership() {
        Leadership l = leadership;
        return l != null && l.isHeld();
    }

    /** The current term while this latch leads; null otherwise. */
    public Leadership leadership() {
        Leadership l = leadership;
        return l != null && l.isHeld() ? l : null;
    }

    /** Waits until this latch leads. */
    public void await() throws InterruptedException {
        synchronized (lock) {
            while (!hasLeadership()) {
                if (closed) throw new IllegalStateException("closed");
                lock.wait();
            }
        }
    }

    /** Waits up to the time until this latch leads: true when it does. */
    public boolean await(long time, TimeUnit unit) throws InterruptedException {
        long until = System.nanoTime() + unit.toNanos(time);
        synchronized (lock) {
            while (!hasLeadership()) {
                long left = until - System.nanoTime();
                if (left <= 0 || closed) return false;
                TimeUnit.NANOSECONDS.timedWait(lock, left);
            }
            return true;
        }
    }

    /** The election's leader now (any process's); null when nobody leads. */
    public Leader getLeader() {
        return client.leader(name);
    }

    /** Resigns if it leads (the next candidate is elected at once), withdraws its candidacy, stops. */
    @Override
    public void close() {
        Thread t;
        synchronized (lock) {
            if (closed) return;
            closed = true;
            t = thread;
            lock.notifyAll();
        }
        if (t != null) {
            t.interrupt();
            try {
                t.join(10_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
