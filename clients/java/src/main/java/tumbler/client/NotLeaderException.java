package tumbler.client;

/** The leadership's term is over (resigned, lapsed or cleared): Proclaim answered NOT_LEADER, or it was lost. */
public class NotLeaderException extends LockLostException {
    private static final long serialVersionUID = 1L;

    public NotLeaderException(String method, String message, String reason) {
        super("not_leader", method, message, reason);
    }
}
