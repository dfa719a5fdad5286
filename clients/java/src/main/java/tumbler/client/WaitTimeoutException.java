package tumbler.client;

/** Waited the whole wait in the server's queue without a grant. */
public class WaitTimeoutException extends NotAcquiredException {
    private static final long serialVersionUID = 1L;

    WaitTimeoutException(String message, int holders, int queuePosition) {
        super(message, holders, queuePosition);
    }
}
