package tumbler.client;

import java.util.concurrent.locks.ReadWriteLock;

/**
 * A {@link ReadWriteLock} held in tumbler: any number of readers (up to a limit, default the server's maximum) or
 * one writer, never both, across every process. Each of its locks is a {@link TumblerLock} (owned by the thread,
 * reentrant, with a watchdog). Unlike {@code ReentrantReadWriteLock}, a thread that holds the write lock does not
 * take the read lock beside it: it downgrades its grant ({@code writeLock().heldLock().downgrade()}: the same token,
 * readers may join); asking the read lock then throws IllegalStateException rather than waiting for itself.
 */
public final class TumblerReadWriteLock implements ReadWriteLock {
    private final TumblerLock read;
    private final TumblerLock write;
    private final String name;

    TumblerReadWriteLock(TumblerClient client, String name, LockOptions options) {
        this.name = name;
        this.read = new TumblerLock(client, name, null, options.copy().mode(LockMode.READ));
        this.write = new TumblerLock(client, name, null, options.copy().mode(LockMode.WRITE));
    }

    @Override
    public TumblerLock readLock() {
        return read;
    }

    @Override
    public TumblerLock writeLock() {
        return write;
    }

    public String getName() {
        return name;
    }
}
