package tumbler.client;

import java.time.Duration;
import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.Lock;
import java.util.function.Consumer;

/**
 * A {@link Lock} held in tumbler, as Redisson's {@code RLock}: owned by the thread that locked it (its holder is
 * the client's id and the thread's), reentrant (a thread that holds it may lock it again; each lock needs its
 * unlock), with a watchdog that extends the lease (default 30 s) each third of it while the thread holds it.
 *
 * <p>{@link #lock()} waits in the server's queue as long as it takes; {@link #tryLock()} tries once;
 * {@link #tryLock(long, TimeUnit)} waits up to the time; {@link #lockInterruptibly()} stops waiting on an interrupt
 * (the request leaves the server's queue at once). {@link #unlock()} by a thread that does not hold it throws
 * {@link IllegalMonitorStateException}; when the lock was lost while held (the lease ran out, an admin took it) it
 * throws {@link LockLostException} after forgetting it. {@link #isHeldByCurrentThread()} turns false once it is
 * lost; {@link #addLostListener} hears it at once.
 *
 * <p>Made by {@link TumblerClient#getLock}, {@link TumblerClient#getMultiLock} (all names or none) and
 * {@link TumblerReadWriteLock}. {@link #newCondition()} is not supported.
 */
public class TumblerLock implements Lock {
    /** How long one waiting Acquire of {@link #lock()} waits before it asks again (the server's maximum is 1 h). */
    static final Duration WAIT_CHUNK = Duration.ofMinutes(10);

    final TumblerClient client;
    final String name;
    final List<String> names;
    final LockOptions options;
    private final List<Consumer<LockLostException>> lostListeners = new CopyOnWriteArrayList<>();

    /** One thread's hold: the guard and how many times the thread locked it. */
    static final class Hold {
        final HeldLock held;
        int count = 1;

        Hold(HeldLock held) {
            this.held = held;
        }
    }

    TumblerLock(TumblerClient client, String name, List<String> names, LockOptions options) {
        this.client = client;
        this.name = name;
        this.names = names == null ? null : List.copyOf(names);
        this.options = options;
        if (options.ttl == null) options.ttl = Duration.ofSeconds(30);
    }

    private String modeTag() {
        return options.mode == null ? "" : options.mode == LockMode.READ ? "r" : "w";
    }

    private String key(LockMode mode, long threadId) {
        String ns = options.namespace != null ? options.namespace : String.valueOf(client.namespace());
        String what = names != null ? String.join("\u0000", names) : name;
        return ns + "\u0001" + what + "\u0001" + (mode == null ? "" : mode.name()) + "\u0001" + threadId;
    }

    private String key() {
        return key(options.mode, Thread.currentThread().getId());
    }

    /** The holder this thread's grants carry: the client's id, the mode, the thread's id. */
    public String holderForCurrentThread() {
        return client.clientId + "-" + modeTag() + "t" + Thread.currentThread().getId();
    }

    /** Called when a hold of this lock is lost (on a watchdog thread). */
    public TumblerLock addLostListener(Consumer<LockLostException> listener) {
        lostListeners.add(listener);
        return this;
    }

    /** True when a hold by this thread is there already (counted); false when a new grant is needed. */
    private boolean reenter() {
        Hold h = client.holds.get(key());
        if (h == null) return false;
        if (h.held.isHeld()) {
            h.count++;
            return true;
        }
        client.holds.remove(key());
        return false;
    }

    private void refuseSelfDeadlock() {
        if (options.mode == LockMode.READ && client.holds.containsKey(key(LockMode.WRITE, Thread.currentThread().getId()))) {
            throw new IllegalStateException(label() + ": this thread holds the write lock; a read lock would wait for "
                    + "it forever. Use heldLock().downgrade() on the write lock instead");
        }
        if (options.mode == LockMode.WRITE && client.holds.containsKey(key(LockMode.READ, Thread.currentThread().getId()))) {
            throw new IllegalStateException(label() + ": this thread holds the read lock; release it before the write "
                    + "lock (an upgrade could wait forever)");
        }
    }

    private String label() {
        return names != null ? String.join(",", names) : name;
    }

    /** One Acquire for this thread, waiting {@code wait}; the hold, or NotAcquiredException. */
    private HeldLock attempt(Duration wait, boolean interruptible) throws InterruptedException {
        LockOptions o = options.copy().holder(holderForCurrentThread()).wait(wait);
        HeldLock held = client.held(name, names, o, interruptible);
        for (Consumer<LockLostException> l : lostListeners) held.onLost(l);
        client.holds.put(key(), new Hold(held));
        return held;
    }

    @Override
    public void lock() {
        if (reenter()) return;
        refuseSelfDeadlock();
        while (true) {
            try {
                attempt(WAIT_CHUNK, false);
                return;
            } catch (WaitTimeoutException e) {
                // ask again
            } catch (InterruptedException e) {
                throw new IllegalStateException(e); // not interruptible
            }
        }
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
        if (Thread.interrupted()) throw new InterruptedException();
        if (reenter()) return;
        refuseSelfDeadlock();
        while (true) {
            try {
                attempt(WAIT_CHUNK, true);
                return;
            } catch (WaitTimeoutException e) {
                // ask again
            }
        }
    }

    @Override
    public boolean tryLock() {
        if (reenter()) return true;
        refuseSelfDeadlock();
        try {
            attempt(Duration.ZERO, false);
            return true;
        } catch (NotAcquiredException e) {
            return false;
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Waits up to the time in the server's queue; an interrupt stops the wait (the request leaves the queue). */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) throw new InterruptedException();
        if (reenter()) return true;
        refuseSelfDeadlock();
        try {
            attempt(Duration.ofNanos(unit.toNanos(Math.max(0, time))), true);
            return true;
        } catch (NotAcquiredException e) {
            return false;
        }
    }

    /**
     * Unlocks once; the last unlock of this thread releases the grant. {@link IllegalMonitorStateException} when this
     * thread does not hold it; {@link LockLostException} when it was lost while held (forgotten all the same).
     */
    @Override
    public void unlock() {
        Hold h = client.holds.get(key());
        if (h == null) {
            throw new IllegalMonitorStateException(label() + ": not locked by the current thread");
        }
        if (--h.count > 0) return;
        client.holds.remove(key());
        h.held.close();
    }

    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("a tumbler lock has no conditions");
    }

    /** True while this thread holds it; false once it is lost (the lease ran out, or it was taken away). */
    public boolean isHeldByCurrentThread() {
        Hold h = client.holds.get(key());
        return h != null && h.held.isHeld();
    }

    /** How many times this thread locked it without unlocking (0 when it does not hold it). */
    public int getHoldCount() {
        Hold h = client.holds.get(key());
        return h == null ? 0 : h.count;
    }

    /** True when anyone holds it now (an Inspect; a multi-lock: any of its names). */
    public boolean isLocked() {
        if (names == null) return !client.inspect(name).holders().isEmpty();
        for (String n : names) {
            if (!client.inspect(n).holders().isEmpty()) return true;
        }
        return false;
    }

    /** This thread's hold (its grant(s), fencing token, lost listeners, downgrade). */
    public HeldLock heldLock() {
        Hold h = client.holds.get(key());
        if (h == null) throw new IllegalMonitorStateException(label() + ": not locked by the current thread");
        return h.held;
    }

    /** The fencing token of this thread's grant (a set's first lock's). */
    public long fencingToken() {
        return heldLock().fencingToken();
    }

    public String getName() {
        return label();
    }

    @Override
    public String toString() {
        return "TumblerLock{" + label() + (options.mode == null ? "" : ", " + options.mode) + "}";
    }
}
