package tumbler.client;

/** An https server whose certificate did not verify: nothing was sent to it (not retried). */
public class TlsException extends TumblerException {
    private static final long serialVersionUID = 1L;

    public TlsException(String method, String message) {
        super("tls", method, 0, message);
    }
}
