package tumbler.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

/** Inspect's answer: a lock's live holders, its limit and mode, the permits in use and how many wait. */
public final class LockInfo {
    private final String name;
    private final int limit;
    private final List<Grant> holders;
    private final int waiters;
    private final LockMode mode;
    private final int permitsInUse;
    private final long nowMs;

    private LockInfo(String name, int limit, List<Grant> holders, int waiters, LockMode mode, int permitsInUse,
                     long nowMs) {
        this.name = name;
        this.limit = limit;
        this.holders = holders;
        this.waiters = waiters;
        this.mode = mode;
        this.permitsInUse = permitsInUse;
        this.nowMs = nowMs;
    }

    static LockInfo fromJson(Map<String, Object> m, String name) {
        List<Grant> holders = new ArrayList<>();
        for (Object h : Json.array(m.get("holders"))) {
            holders.add(Grant.fromJson(Json.object(Json.object(h).get("grant")), name, false));
        }
        return new LockInfo(name, (int) Json.i64(m, "limit"), Collections.unmodifiableList(holders),
                (int) Json.i64(m, "waiters"), LockMode.fromWire(Json.str(m, "mode")), (int) Json.i64(m, "permitsInUse"),
                Json.i64(m, "nowMs"));
    }

    public String name() { return name; }
    /** The limit of the latest grant; 0 when nobody holds the lock. */
    public int limit() { return limit; }
    /** Live holders, by slot. */
    public List<Grant> holders() { return holders; }
    public int waiters() { return waiters; }
    public LockMode mode() { return mode; }
    public int permitsInUse() { return permitsInUse; }
    /** The Redis clock when the lock was read. */
    public long nowMs() { return nowMs; }

    @Override
    public String toString() {
        return "LockInfo{" + name + ", limit=" + limit + ", holders=" + holders + ", waiters=" + waiters + "}";
    }
}
