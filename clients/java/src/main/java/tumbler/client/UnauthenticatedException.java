package tumbler.client;

/** {@code unauthenticated}: no bearer token, or one the server does not know (or that expired). */
public class UnauthenticatedException extends PermissionDeniedException {
    private static final long serialVersionUID = 1L;

    public UnauthenticatedException(String method, int httpStatus, String message) {
        super("unauthenticated", method, httpStatus, message);
    }
}
