package tumbler.client;

/** {@code resource_exhausted}: a limit or quota of the server is full (the message names it). */
public class ResourceExhaustedException extends TumblerException {
    private static final long serialVersionUID = 1L;

    public ResourceExhaustedException(String method, int httpStatus, String message) {
        super("resource_exhausted", method, httpStatus, message);
    }
}
