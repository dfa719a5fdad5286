package tumbler.client;

/**
 * A request the server refused as malformed ({@code invalid_argument}): the message starts with the field and
 * says the rule ({@code "name: ..."}, {@code "ttl_ms: ..."}). Nothing was applied.
 */
public class InvalidArgumentException extends TumblerException {
    private static final long serialVersionUID = 1L;

    public InvalidArgumentException(String code, String method, int httpStatus, String message) {
        super(code, method, httpStatus, message);
    }

    /** The field the message names (the text before its first colon), or "" when it names none. */
    public String field() {
        String m = getMessage();
        int colon = m == null ? -1 : m.indexOf(':');
        return colon > 0 && m.substring(0, colon).matches("[A-Za-z_.\\[\\]0-9]+") ? m.substring(0, colon) : "";
    }
}
