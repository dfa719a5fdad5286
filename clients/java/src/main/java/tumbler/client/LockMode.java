package tumbler.client;

/** A read/write lock's mode: READ (shared with other readers) or WRITE (alone). */
public enum LockMode {
    READ, WRITE;

    String wire() {
        return this == READ ? "LOCK_MODE_READ" : "LOCK_MODE_WRITE";
    }

    static LockMode fromWire(String s) {
        if ("LOCK_MODE_READ".equals(s)) return READ;
        if ("LOCK_MODE_WRITE".equals(s)) return WRITE;
        return null;
    }
}
