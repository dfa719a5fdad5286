package tumbler.client;

/** Tried once (wait 0): every permit held by others, or (fair) others wait first. */
public class BusyException extends NotAcquiredException {
    private static final long serialVersionUID = 1L;

    BusyException(String message, int holders) {
        super(message, holders, 0);
    }
}
