package tumbler.client;

/**
 * The server refused the caller: {@code permission_denied} (this token may not do that, or the namespace is
 * reserved), or, as the subclass {@link UnauthenticatedException}, a missing, unknown or expired bearer token.
 */
public class PermissionDeniedException extends TumblerException {
    private static final long serialVersionUID = 1L;

    public PermissionDeniedException(String code, String method, int httpStatus, String message) {
        super(code, method, httpStatus, message);
    }
}
