package tumbler.client;

/**
 * The wait would have closed a wait-for cycle (the server answered {@code aborted}, {@code "deadlock: ..."} naming
 * the cycle). Nothing of the refused wait stays queued: release what you hold and try again.
 */
public class DeadlockException extends TumblerException {
    private static final long serialVersionUID = 1L;

    public DeadlockException(String method, String message) {
        super("aborted", method, 409, message);
    }
}
