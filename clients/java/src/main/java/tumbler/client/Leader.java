package tumbler.client;

import java.util.Map;

/** One term of one leader, as Leader and Observe show it to anyone with the namespace. */
public final class Leader {
    private final String name;
    private final String candidate;
    private final long term;
    private final String value;
    private final long electedAtMs;
    private final long expiresAtMs;
    private final long ttlMs;

    Leader(String name, String candidate, long term, String value, long electedAtMs, long expiresAtMs, long ttlMs) {
        this.name = name;
        this.candidate = candidate;
        this.term = term;
        this.value = value;
        this.electedAtMs = electedAtMs;
        this.expiresAtMs = expiresAtMs;
        this.ttlMs = ttlMs;
    }

    static Leader fromJson(Object o, String name) {
        if (!(o instanceof Map)) return null;
        Map<String, Object> m = Json.object(o);
        String n = Json.str(m, "name");
        return new Leader(n.isEmpty() ? name : n, Json.str(m, "candidate"), Json.i64(m, "term"), Json.str(m, "value"),
                Json.i64(m, "electedAtMs"), Json.i64(m, "expiresAtMs"), Json.i64(m, "ttlMs"));
    }

    public String name() { return name; }
    public String candidate() { return candidate; }
    /** The term: a fencing token, strictly greater than every term before. */
    public long term() { return term; }
    public String value() { return value; }
    public long electedAtMs() { return electedAtMs; }
    public long expiresAtMs() { return expiresAtMs; }
    public long ttlMs() { return ttlMs; }

    @Override
    public String toString() {
        return "Leader{" + candidate + ", term=" + term + ", value=" + value + "}";
    }
}
