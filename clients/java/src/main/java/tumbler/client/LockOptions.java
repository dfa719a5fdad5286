package tumbler.client;

import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * What an Acquire asks, beside the name: a fluent, mutable set of options ({@code new LockOptions().ttl(...)}).
 * Unset options are the server's defaults (lease 30 s, limit 1, fair, try once).
 */
public final class LockOptions {
    String holder;
    Duration ttl;
    Duration wait;
    Duration queueTtl;
    Integer limit;
    Integer permits;
    String kind;
    Map<String, String> metadata;
    Integer priority;
    Boolean fair;
    LockMode mode;
    boolean preferReaders;
    String namespace;

    public LockOptions() {}

    public LockOptions copy() {
        LockOptions o = new LockOptions();
        o.holder = holder;
        o.ttl = ttl;
        o.wait = wait;
        o.queueTtl = queueTtl;
        o.limit = limit;
        o.permits = permits;
        o.kind = kind;
        o.metadata = metadata == null ? null : new LinkedHashMap<>(metadata);
        o.priority = priority;
        o.fair = fair;
        o.mode = mode;
        o.preferReaders = preferReaders;
        o.namespace = namespace;
        return o;
    }

    /** Who holds the grant. Unset: the client makes an id, and a retry of the call sends the same one. */
    public LockOptions holder(String holder) { this.holder = holder; return this; }
    /** The lease; the watchdog of a held lock extends it by this much each third of it. */
    public LockOptions ttl(Duration ttl) { this.ttl = ttl; return this; }
    /** How long to wait in the server's queue (zero: try once). */
    public LockOptions wait(Duration wait) { this.wait = wait; return this; }
    /** How long a waiting request lives in the queue without its server refreshing it. */
    public LockOptions queueTtl(Duration queueTtl) { this.queueTtl = queueTtl; return this; }
    /** How many permits the lock has (1: a mutex; more: a semaphore; with a mode: the most readers). */
    public LockOptions limit(int limit) { this.limit = limit; return this; }
    /** How many of the limit's permits this grant takes (default 1). */
    public LockOptions permits(int permits) { this.permits = permits; return this; }
    /** A short metrics label ([a-z0-9_.-], at most 32 bytes). */
    public LockOptions kind(String kind) { this.kind = kind; return this; }
    /** Stored with the grant, shown by inspect. */
    public LockOptions metadata(Map<String, String> metadata) { this.metadata = metadata; return this; }
    public LockOptions metadata(String key, String value) {
        if (metadata == null) metadata = new LinkedHashMap<>();
        metadata.put(key, value);
        return this;
    }
    /** Higher goes first in the queue (-1000..1000). */
    public LockOptions priority(int priority) { this.priority = priority; return this; }
    /** False: take a free permit whoever waits (barging). */
    public LockOptions fair(boolean fair) { this.fair = fair; return this; }
    /** READ or WRITE: a read/write lock. */
    public LockOptions mode(LockMode mode) { this.mode = mode; return this; }
    /** With READ: pass writers that wait. */
    public LockOptions preferReaders(boolean preferReaders) { this.preferReaders = preferReaders; return this; }
    /** Another namespace than the client's. */
    public LockOptions namespace(String namespace) { this.namespace = namespace; return this; }

    public String holder() { return holder; }
    public Duration ttl() { return ttl; }
    public Duration waitTime() { return wait; }
}
