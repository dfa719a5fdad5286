package tumbler.client;

/**
 * No server answered within the call's deadline: nothing listening, a broken connection, or {@code unavailable}
 * (Redis down), retried with back-off until the deadline. Never a grant.
 */
public class UnavailableException extends TumblerException {
    private static final long serialVersionUID = 1L;
    private final int attempts;

    public UnavailableException(String method, int httpStatus, String message, int attempts) {
        super("unavailable", method, httpStatus, message);
        this.attempts = attempts;
    }

    /** How many times the call was sent. */
    public int attempts() {
        return attempts;
    }
}
