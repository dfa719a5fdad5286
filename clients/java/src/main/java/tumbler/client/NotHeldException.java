package tumbler.client;

/** Extend answered NOT_HELD: the holder does not hold the lock (with that token) any more. */
public class NotHeldException extends LockLostException {
    private static final long serialVersionUID = 1L;

    public NotHeldException(String method, String message) {
        super("not_held", method, message, "not held any more (released by another, cleared or reaped)");
    }
}
