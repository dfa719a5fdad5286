package tumbler.client;

/**
 * A well-formed request the lock's present state refuses ({@code failed_precondition}): another limit or mode for a
 * lock that is held, a reader's upgrade to write, a plain acquire of a held read/write lock.
 */
public class FailedPreconditionException extends TumblerException {
    private static final long serialVersionUID = 1L;

    public FailedPreconditionException(String method, int httpStatus, String message) {
        super("failed_precondition", method, httpStatus, message);
    }
}
