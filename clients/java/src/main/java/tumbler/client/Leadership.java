package tumbler.client;

import java.util.List;

/**
 * One term of this process as an election's leader: a {@link HeldLock} whose holder is the candidate and whose
 * fencing token is the term. Its watchdog keeps the lease; {@link #isLost()} turns true once the term ended under
 * it. It keeps the secret its winning Campaign was told, which {@link #proclaim} and {@link #resign} send (decision
 * 0082: the candidate and term are readable by anyone with the namespace, the secret is not). Closing it resigns.
 */
public final class Leadership extends HeldLock {
    private volatile Leader leader;
    private final String secret;

    Leadership(TumblerClient client, String name, String namespace, Leader leader, String secret) {
        super(client, name, null, List.of(new Grant(name, leader.candidate(), leader.term(), 1, List.of(1), 1,
                leader.electedAtMs(), leader.expiresAtMs(), leader.ttlMs(), "", java.util.Map.of(), null, false)),
                namespace, null, null);
        this.leader = leader;
        this.secret = secret;
    }

    public Leader leader() { return leader; }
    public String candidate() { return leader.candidate(); }
    /** The term: a fencing token, strictly greater than every term (and token) before it. */
    public long term() { return leader.term(); }
    public String value() { return leader.value(); }
    /** The secret only the winning Campaign was told (Proclaim and Resign send it). */
    public String secret() { return secret; }

    @Override
    LockLostException lostException() {
        return new NotLeaderException("check", name + ": " + candidate() + " no longer leads (term " + term() + "): "
                + lostReason(), lostReason());
    }

    /**
     * Replaces the value others see. Throws {@link NotLeaderException} (and the leadership is lost from then on)
     * when the term is over.
     */
    public Leadership proclaim(String value) {
        try {
            leader = client.proclaim(name, namespace, candidate(), term(), secret, value);
        } catch (NotLeaderException e) {
            lose("not the leader");
            throw e;
        }
        return this;
    }

    /** Steps down at once (the next candidate is elected): true when this call ended the term; safe to repeat. */
    public boolean resign() {
        return release();
    }

    @Override
    boolean releaseCall() {
        return client.resign(name, namespace, candidate(), term(), secret, 5_000_000_000L);
    }

    /** Resigns; throws {@link NotLeaderException} when the term was lost while held. */
    @Override
    public void close() {
        super.close();
    }
}
