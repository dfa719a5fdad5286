package tumbler.client;

/**
 * Every error of the client. {@link #code()} is the Connect code the server answered ({@code invalid_argument},
 * {@code permission_denied}, ...) or the client's own ({@code not_acquired}, {@code lost}, {@code not_held},
 * {@code tls}); {@link #getMessage()} is the server's message, which names the field for bad input. The subclasses
 * are what a caller catches: {@link BusyException}, {@link WaitTimeoutException}, {@link DeadlockException},
 * {@link LockLostException}, {@link PermissionDeniedException}, {@link InvalidArgumentException},
 * {@link UnavailableException}.
 */
public class TumblerException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final String code;
    private final String method;
    private final int httpStatus;

    public TumblerException(String code, String method, int httpStatus, String message) {
        super(message);
        this.code = code;
        this.method = method;
        this.httpStatus = httpStatus;
    }

    /** The Connect code ({@code invalid_argument}, {@code unavailable}, ...) or the client's own. */
    public String code() {
        return code;
    }

    /** The RPC it came from (Acquire, Extend, ...), or what the client was doing. */
    public String method() {
        return method;
    }

    /** The HTTP status of the answer; 0 when there was none. */
    public int httpStatus() {
        return httpStatus;
    }

    @Override
    public String toString() {
        return getClass().getSimpleName() + ": tumbler " + code + (method == null ? "" : " (" + method + ")")
                + ": " + getMessage();
    }

    /** The typed exception for a Connect error answer. */
    static TumblerException fromConnect(String code, String message, int httpStatus, String method, int attempts) {
        if (code == null || code.isEmpty()) code = codeForHttp(httpStatus);
        switch (code) {
            case "invalid_argument":
            case "out_of_range":
                return new InvalidArgumentException(code, method, httpStatus, message);
            case "failed_precondition":
                return new FailedPreconditionException(method, httpStatus, message);
            case "permission_denied":
                return new PermissionDeniedException(code, method, httpStatus, message);
            case "unauthenticated":
                return new UnauthenticatedException(method, httpStatus, message);
            case "unavailable":
                return new UnavailableException(method, httpStatus, message, attempts);
            case "aborted":
                if (message.startsWith("deadlock: ")) return new DeadlockException(method, message);
                return new TumblerException(code, method, httpStatus, message);
            case "resource_exhausted":
                return new ResourceExhaustedException(method, httpStatus, message);
            default:
                return new TumblerException(code, method, httpStatus, message);
        }
    }

    static String codeForHttp(int status) {
        switch (status) {
            case 400: return "invalid_argument";
            case 401: return "unauthenticated";
            case 403: return "permission_denied";
            case 404: return "unimplemented";
            case 409: return "aborted";
            case 429: return "resource_exhausted";
            case 499: return "canceled";
            case 501: return "unimplemented";
            case 503: return "unavailable";
            case 504: return "deadline_exceeded";
            default: return "unknown";
        }
    }
}
