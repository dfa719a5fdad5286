package tumbler.client;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One grant of a lock, as the server answered it: the holder, the fencing token (strictly greater than every token
 * granted before for the lock: hand it to what you protect), the slot(s), the lease (Redis clock), and for a
 * multi-lock's grants the lock's name.
 */
public final class Grant {
    private final String name;
    private final String holder;
    private final long fencingToken;
    private final int slot;
    private final List<Integer> slots;
    private final int permits;
    private final long acquiredAtMs;
    private final long expiresAtMs;
    private final long ttlMs;
    private final String kind;
    private final Map<String, String> metadata;
    private final LockMode mode;
    private final boolean alreadyHeld;

    Grant(String name, String holder, long fencingToken, int slot, List<Integer> slots, int permits,
          long acquiredAtMs, long expiresAtMs, long ttlMs, String kind, Map<String, String> metadata, LockMode mode,
          boolean alreadyHeld) {
        this.name = name;
        this.holder = holder;
        this.fencingToken = fencingToken;
        this.slot = slot;
        this.slots = slots;
        this.permits = permits;
        this.acquiredAtMs = acquiredAtMs;
        this.expiresAtMs = expiresAtMs;
        this.ttlMs = ttlMs;
        this.kind = kind;
        this.metadata = metadata;
        this.mode = mode;
        this.alreadyHeld = alreadyHeld;
    }

    /** A Grant message of the proto3 JSON answer; {@code name} when the message names none. */
    static Grant fromJson(Map<String, Object> g, String name, boolean alreadyHeld) {
        List<Integer> slots = new ArrayList<>();
        for (Object o : Json.array(g.get("slots"))) slots.add((int) Json.i64(o));
        int slot = (int) Json.i64(g, "slot");
        if (slots.isEmpty() && slot > 0) slots.add(slot);
        int permits = (int) Json.i64(g, "permits");
        Map<String, String> md = new LinkedHashMap<>();
        for (Map.Entry<String, Object> e : Json.object(g.get("metadata")).entrySet()) {
            md.put(e.getKey(), String.valueOf(e.getValue()));
        }
        String n = Json.str(g, "name");
        return new Grant(n.isEmpty() ? name : n, Json.str(g, "holder"), Json.i64(g, "fencingToken"), slot,
                Collections.unmodifiableList(slots), permits == 0 ? 1 : permits, Json.i64(g, "acquiredAtMs"),
                Json.i64(g, "expiresAtMs"), Json.i64(g, "ttlMs"), Json.str(g, "kind"),
                Collections.unmodifiableMap(md), LockMode.fromWire(Json.str(g, "mode")), alreadyHeld);
    }

    Grant withLease(Grant renewed) {
        return new Grant(name, holder, fencingToken, slot, renewed.slots.isEmpty() ? slots : renewed.slots,
                renewed.permits, acquiredAtMs, renewed.expiresAtMs, renewed.ttlMs == 0 ? ttlMs : renewed.ttlMs, kind,
                metadata, renewed.mode == null ? mode : renewed.mode, alreadyHeld);
    }

    public String name() { return name; }
    public String holder() { return holder; }
    public long fencingToken() { return fencingToken; }
    /** The first slot (1..limit): a partition or worker index. */
    public int slot() { return slot; }
    /** One slot per permit, ascending. */
    public List<Integer> slots() { return slots; }
    /** The permits the grant holds (1 unless more were asked). */
    public int permits() { return permits; }
    public long acquiredAtMs() { return acquiredAtMs; }
    /** When the lease ends unless extended (Redis clock, Unix ms). */
    public long expiresAtMs() { return expiresAtMs; }
    public long ttlMs() { return ttlMs; }
    public String kind() { return kind; }
    public Map<String, String> metadata() { return metadata; }
    /** READ or WRITE for a read/write lock's grant; null for a plain lock's. */
    public LockMode mode() { return mode; }
    /** True when the holder held it already (a retry, or an acquire again by the same holder): the same grant. */
    public boolean alreadyHeld() { return alreadyHeld; }

    @Override
    public String toString() {
        return "Grant{" + (name == null ? "" : name + " ") + "holder=" + holder + ", token=" + fencingToken
                + ", slots=" + slots + (mode == null ? "" : ", mode=" + mode) + ", expiresAtMs=" + expiresAtMs + "}";
    }
}
