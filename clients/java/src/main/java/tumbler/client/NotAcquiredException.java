package tumbler.client;

/**
 * The lock was not granted (not an error of the server: an answer). {@link BusyException}: tried once and every
 * permit was held (or, fair, others wait first); {@link WaitTimeoutException}: waited the whole wait in the queue.
 */
public class NotAcquiredException extends TumblerException {
    private static final long serialVersionUID = 1L;
    private final int holders;
    private final int queuePosition;

    NotAcquiredException(String message, int holders, int queuePosition) {
        super("not_acquired", "Acquire", 200, message);
        this.holders = holders;
        this.queuePosition = queuePosition;
    }

    /** The permits in use when it was refused. */
    public int holders() {
        return holders;
    }

    /** For a timeout: the last place it had in the queue (1 = next). */
    public int queuePosition() {
        return queuePosition;
    }

    /** True for {@link BusyException}. */
    public boolean busy() {
        return this instanceof BusyException;
    }
}
