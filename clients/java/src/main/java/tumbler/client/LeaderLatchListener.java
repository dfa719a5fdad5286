package tumbler.client;

/** Told when a {@link LeaderLatch} gains or loses the leadership (on the latch's thread), as Curator's. */
public interface LeaderLatchListener {
    /** This latch leads now. */
    void isLeader();

    /** This latch no longer leads (its term was lost, or the latch was closed while leading). */
    void notLeader();
}
