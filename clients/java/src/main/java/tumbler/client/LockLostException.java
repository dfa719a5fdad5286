package tumbler.client;

/**
 * A grant this process held is gone: its lease ran out before a renewal, or the server answered that it is not
 * held any more (released with its token by an admin, cleared, reaped). Stop what the lock protected.
 * {@link #reason()} says which.
 */
public class LockLostException extends TumblerException {
    private static final long serialVersionUID = 1L;
    private final String reason;

    public LockLostException(String code, String method, String message, String reason) {
        super(code, method, 0, message);
        this.reason = reason;
    }

    /** "lease ran out before a renewal: ..." or "not held any more (...)". */
    public String reason() {
        return reason;
    }
}
