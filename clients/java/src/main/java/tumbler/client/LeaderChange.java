package tumbler.client;

/**
 * One change of an election, as {@link TumblerClient#observe} tells it: {@code current} (the first: the leader when
 * the stream started), {@code elected}, {@code proclaimed}, and, leaving nobody leading, {@code resigned},
 * {@code expired} or {@code removed}.
 */
public final class LeaderChange {
    private final String event;
    private final Leader leader;
    private final long atMs;
    private final long endedTerm;

    LeaderChange(String event, Leader leader, long atMs, long endedTerm) {
        this.event = event;
        this.leader = leader;
        this.atMs = atMs;
        this.endedTerm = endedTerm;
    }

    public String event() { return event; }
    /** The leader after the change; null when nobody leads. */
    public Leader leader() { return leader; }
    public long atMs() { return atMs; }
    /** For resigned, expired and removed: the term that ended. */
    public long endedTerm() { return endedTerm; }

    @Override
    public String toString() {
        return "LeaderChange{" + event + ", " + leader + "}";
    }
}
