package tumbler.client;

import java.io.IOException;
import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.net.SocketTimeoutException;
import java.net.URI;
import java.nio.channels.ClosedByInterruptException;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.net.http.HttpTimeoutException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.SecureRandom;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Predicate;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLHandshakeException;
import javax.net.ssl.TrustManagerFactory;

/**
 * A client of the tumbler lock service over the Connect protocol (JSON over HTTP) on the server's gRPC port, with
 * nothing but the JDK: {@link java.net.http.HttpClient} for {@code https://} (HTTP/2 over TLS), and for
 * {@code http://} HTTP/1.1 kept-alive connections of its own ({@link SocketTransport}; {@link
 * Builder#useHttpClient} for HttpClient there too). Thread-safe; make one per process and share it.
 *
 * <pre>{@code
 * try (TumblerClient client = TumblerClient.builder().endpoint("http://127.0.0.1:50051").build();
 *      HeldLock lock = client.lock("nightly-report", new LockOptions().ttl(Duration.ofSeconds(30)))) {
 *     write(report, lock.fencingToken());
 * }
 * }</pre>
 *
 * Every call is one {@code POST /tumbler.v1.LockService/<Method>}. A call that finds no server (refused, reset) or
 * gets {@code unavailable} is sent again with jittered back-off until its deadline (the client's timeout, plus the
 * wait of a waiting acquire), then throws {@link UnavailableException}. Retries of an acquire send the same holder,
 * so a retry never takes a second permit.
 */
public final class TumblerClient implements AutoCloseable {
    static final String SERVICE = "/tumbler.v1.LockService/";
    private static final AtomicLong SEQ = new AtomicLong();
    private static final String HOST_PID = hostPid();

    /** The calls' transport for http:// (unless the builder asks for HttpClient); null for https://. */
    private final SocketTransport socket;
    /** java.net.http for https:// (HTTP/2 over TLS), for Observe streams, and when the builder asks for it. */
    private volatile HttpClient http;
    private final HttpClient.Builder httpBuilder;
    private final String endpoint;
    private final String namespace;
    private final String authorization;
    private final long timeoutNanos;
    private final long backoffNanos;
    private final long maxBackoffNanos;
    private final Map<String, URI> uris = new ConcurrentHashMap<>();
    /** The watchdogs' timer (one daemon thread) and the renewals' workers (daemon threads, made as needed). */
    final ScheduledExecutorService timer;
    final ExecutorService workers;
    /** This client's id, the prefix of the holders its {@link TumblerLock}s use (one per thread, as Redisson's). */
    final String clientId;
    /** Per-thread holds of {@link TumblerLock}s: key (namespace, names, mode, thread) to the hold. */
    final Map<String, TumblerLock.Hold> holds = new ConcurrentHashMap<>();

    private TumblerClient(Builder b) {
        String ep = b.endpoint.replaceAll("/+$", "");
        if (!ep.startsWith("http://") && !ep.startsWith("https://")) ep = "http://" + ep;
        this.endpoint = ep;
        this.namespace = b.namespace;
        this.authorization = b.token == null || b.token.isEmpty() ? null : "Bearer " + b.token;
        this.timeoutNanos = b.timeout.toNanos();
        this.backoffNanos = b.backoff.toNanos();
        this.maxBackoffNanos = b.maxBackoff.toNanos();
        boolean tls = ep.startsWith("https://");
        HttpClient.Builder hb = HttpClient.newBuilder()
                .version(tls ? HttpClient.Version.HTTP_2 : HttpClient.Version.HTTP_1_1)
                .connectTimeout(b.connectTimeout)
                .proxy(b.proxy);
        if (tls) hb.sslContext(b.sslContext != null ? b.sslContext : sslContextFor(b.caFile));
        this.httpBuilder = hb;
        if (tls || b.httpClient) {
            this.http = hb.build();
            this.socket = null;
        } else {
            URI u = URI.create(ep);
            this.socket = new SocketTransport(u.getHost(), u.getPort() < 0 ? 80 : u.getPort(),
                    (int) b.connectTimeout.toMillis());
        }
        this.timer = Executors.newSingleThreadScheduledExecutor(daemon("tumbler-watchdog"));
        this.workers = Executors.newCachedThreadPool(daemon("tumbler-renewal"));
        this.clientId = newHolder();
    }

    private HttpClient http() {
        HttpClient h = http;
        if (h == null) {
            synchronized (this) {
                if (http == null) http = httpBuilder.build();
                h = http;
            }
        }
        return h;
    }

    public static Builder builder() {
        return new Builder();
    }

    /** How a client is made; every setting has a default. */
    public static final class Builder {
        private String endpoint = "http://127.0.0.1:50051";
        private String token;
        private String namespace;
        private Duration timeout = Duration.ofSeconds(10);
        private Duration connectTimeout = Duration.ofSeconds(5);
        private Duration backoff = Duration.ofMillis(50);
        private Duration maxBackoff = Duration.ofSeconds(1);
        private Path caFile;
        private SSLContext sslContext;
        private java.net.ProxySelector proxy = HttpClient.Builder.NO_PROXY;
        private boolean httpClient;

        /** The server's gRPC port: {@code http://host:port} or {@code https://host:port} (a bare host:port is http). */
        public Builder endpoint(String endpoint) { this.endpoint = endpoint; return this; }
        /** A bearer token, sent as {@code Authorization: Bearer} on every call. */
        public Builder token(String token) { this.token = token; return this; }
        /** The namespace of every call (unset: the server's {@code default}). */
        public Builder namespace(String namespace) { this.namespace = namespace; return this; }
        /** Each call's deadline, retries included (a waiting acquire adds its wait). Default 10 s. */
        public Builder timeout(Duration timeout) { this.timeout = timeout; return this; }
        /** How long to wait for a TCP (and TLS) connection. Default 5 s. */
        public Builder connectTimeout(Duration connectTimeout) { this.connectTimeout = connectTimeout; return this; }
        /** The first retry's pause (doubled up to max, with jitter). Default 50 ms, at most 1 s. */
        public Builder backoff(Duration first, Duration max) { this.backoff = first; this.maxBackoff = max; return this; }
        /** https: the CAs to verify the server with, a PEM file (default: the JDK's trust store). */
        public Builder caFile(Path caFile) { this.caFile = caFile; return this; }
        /** https: an SSLContext of your own (a client certificate, another trust store). */
        public Builder sslContext(SSLContext sslContext) { this.sslContext = sslContext; return this; }

        /**
         * A proxy for the calls (default none: a lock service is reached directly, and asking the JDK's default
         * selector costs every call; {@code ProxySelector.getDefault()} follows the {@code http.proxyHost}
         * properties).
         */
        public Builder proxy(java.net.ProxySelector proxy) { this.proxy = proxy; return this; }

        /**
         * True: every call through {@code java.net.http.HttpClient} (HTTP/1.1 kept alive for http://). Default
         * false: http:// calls go over the client's own HTTP/1.1 connections (blocking sockets with TCP_NODELAY, one
         * write per request), which cost about a tenth of HttpClient's CPU per call; https:// always uses
         * HttpClient (HTTP/2 through ALPN, the JDK's TLS and host name checks).
         */
        public Builder useHttpClient(boolean httpClient) { this.httpClient = httpClient; return this; }

        public TumblerClient build() {
            return new TumblerClient(this);
        }
    }

    public String endpoint() { return endpoint; }
    public String namespace() { return namespace; }

    /** Stops the watchdogs' threads. Held locks are not released (their leases end); release them first. */
    @Override
    public void close() {
        if (socket != null) socket.close();
        timer.shutdownNow();
        workers.shutdownNow();
    }

    // ---------------------------------------------------------------- holders, threads, TLS

    /** A holder id made here (host, pid, random, sequence), so that a retried Acquire is the same request. */
    public static String newHolder() {
        return String.format("%s-%016x-%d", HOST_PID, ThreadLocalRandom.current().nextLong(), SEQ.incrementAndGet());
    }

    private static String hostPid() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (IOException | RuntimeException e) {
            host = "java";
        }
        host = host.replaceAll("[^A-Za-z0-9_.-]", "_");
        if (host.length() > 40) host = host.substring(0, 40);
        return host + "-" + ProcessHandle.current().pid();
    }

    static ThreadFactory daemon(String name) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new Thread(r, name + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }

    private static SSLContext sslContextFor(Path caFile) {
        try {
            if (caFile == null) return SSLContext.getDefault();
            KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
            ks.load(null, null);
            int n = 0;
            try (InputStream in = Files.newInputStream(caFile)) {
                for (Certificate c : CertificateFactory.getInstance("X.509").generateCertificates(in)) {
                    ks.setCertificateEntry("ca-" + n++, c);
                }
            }
            if (n == 0) throw new IllegalArgumentException("caFile " + caFile + ": no certificate in it");
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            tmf.init(ks);
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(null, tmf.getTrustManagers(), new SecureRandom());
            return ctx;
        } catch (IOException e) {
            throw new IllegalArgumentException("caFile " + caFile + " is not a readable PEM file: " + e.getMessage(), e);
        } catch (java.security.GeneralSecurityException e) {
            throw new IllegalArgumentException("caFile " + caFile + ": " + e.getMessage(), e);
        }
    }

    // ---------------------------------------------------------------- one call

    /**
     * One unary call with a JSON body of your own (proto3 JSON: lowerCamel names, 64-bit integers as strings), for
     * the RPCs without a method here (List, ListNamespaces, Reap, Clear, Metrics). The client's namespace is added
     * when the body has none. Returns the answer's JSON object.
     */
    public Map<String, Object> rpc(String method, Map<String, Object> body) {
        Map<String, Object> b = new LinkedHashMap<>(body);
        if (!b.containsKey("namespace") && namespace != null) b.put("namespace", namespace);
        return call(method, b, timeoutNanos);
    }

    Map<String, Object> call(String method, Map<String, Object> body, long timeoutNanos) {
        try {
            return send(method, body, timeoutNanos, false);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e); // not thrown when not interruptible
        }
    }

    /**
     * Sends the call until answered or its deadline. Interruptible: an interrupt cancels the request on the wire
     * (its connection is closed, so the server drops a waiting acquire from its queue) and throws
     * InterruptedException. Not interruptible: an interrupt is remembered and set again on return.
     */
    Map<String, Object> send(String method, Map<String, Object> body, long timeoutNanos, boolean interruptible)
            throws InterruptedException {
        long deadline = System.nanoTime() + timeoutNanos;
        byte[] content = Json.write(body).getBytes(StandardCharsets.UTF_8);
        URI uri = uris.computeIfAbsent(method, m -> URI.create(endpoint + SERVICE + m));
        long pause = backoffNanos;
        int attempts = 0;
        String last = "";
        boolean interrupted = false;
        try {
            while (true) {
                long left = deadline - System.nanoTime();
                if (left <= 0 && attempts > 0) break;
                if (left <= 0) left = 1_000_000;
                attempts++;
                int status = 0;
                byte[] answer = null;
                Throwable failure = null;
                if (!interruptible && Thread.interrupted()) interrupted = true;
                if (socket != null) {
                    try {
                        SocketTransport.Answer a = socket.post(SERVICE + method, content, authorization,
                                left / 1_000_000);
                        status = a.status;
                        answer = a.body;
                    } catch (ClosedByInterruptException e) {
                        Thread.interrupted();
                        if (interruptible) throw new InterruptedException(method + ": interrupted");
                        interrupted = true; // not interruptible: sent again (the same request: the same holder)
                        failure = e;
                    } catch (IOException e) {
                        failure = e;
                    }
                } else {
                    HttpRequest.Builder rb = HttpRequest.newBuilder(uri)
                            .timeout(Duration.ofNanos(left))
                            .header("content-type", "application/json")
                            .header("connect-timeout-ms", Long.toString(Math.max(1, left / 1_000_000)))
                            .POST(HttpRequest.BodyPublishers.ofByteArray(content));
                    if (authorization != null) rb.header("authorization", authorization);
                    // send(), not sendAsync(): the JDK completes a public sendAsync's future on another pool, one
                    // more thread hop per call. An interrupt during send() cancels the exchange (its connection
                    // is closed, so the server drops a waiting acquire) and throws InterruptedException.
                    try {
                        HttpResponse<byte[]> res = http().send(rb.build(), HttpResponse.BodyHandlers.ofByteArray());
                        status = res.statusCode();
                        answer = res.body();
                    } catch (InterruptedException ie) {
                        if (interruptible) throw ie;
                        interrupted = true; // not interruptible: sent again (the same request: the same holder)
                        failure = new IOException("interrupted");
                    } catch (IOException e) {
                        failure = e;
                    }
                }
                if (answer != null) {
                    String text = new String(answer, StandardCharsets.UTF_8);
                    if (status == 200) {
                        try {
                            return Json.object(Json.parse(text.isEmpty() ? "{}" : text));
                        } catch (IllegalArgumentException e) {
                            throw new TumblerException("internal", method, 200, "answer is not JSON: "
                                    + text.substring(0, Math.min(200, text.length())));
                        }
                    }
                    String code = null;
                    String message = "HTTP " + status;
                    try {
                        Map<String, Object> err = Json.object(Json.parse(text));
                        if (err.get("code") != null) {
                            code = Json.str(err, "code");
                            message = Json.str(err, "message");
                        }
                    } catch (IllegalArgumentException e) {
                        // not Connect's error body: the code follows the HTTP status
                    }
                    TumblerException e = TumblerException.fromConnect(code, message, status, method, attempts);
                    if (!(e instanceof UnavailableException)) throw e;
                    last = message;
                } else {
                    if (failure instanceof SSLHandshakeException
                            || (failure instanceof SSLException && String.valueOf(failure.getMessage())
                            .matches("(?s).*(certificate|PKIX|No subject alternative|No name matching).*"))) {
                        throw new TlsException(method, "the server's certificate did not verify, nothing was sent: "
                                + failure.getMessage());
                    }
                    if (failure instanceof HttpTimeoutException || failure instanceof SocketTimeoutException) {
                        if (last.isEmpty()) last = "no answer before the deadline";
                    } else if (failure instanceof IOException) {
                        last = failure.toString();
                    } else {
                        throw new TumblerException("internal", method, 0, String.valueOf(failure));
                    }
                }
                left = deadline - System.nanoTime();
                if (left <= 0) break;
                long sleep = (long) (pause * (0.5 + ThreadLocalRandom.current().nextDouble() * 0.5));
                if (sleep > left) sleep = left;
                long until = System.nanoTime() + sleep;
                while (true) {
                    long ms = (until - System.nanoTime()) / 1_000_000;
                    if (ms <= 0) break;
                    try {
                        Thread.sleep(ms);
                    } catch (InterruptedException ie) {
                        if (interruptible) throw ie;
                        interrupted = true;
                    }
                }
                pause = Math.min(pause * 2, maxBackoffNanos);
            }
            throw new UnavailableException(method, 0, String.format("no answer within %d ms after %d attempts: %s",
                    timeoutNanos / 1_000_000, attempts, last), attempts);
        } finally {
            if (interrupted) Thread.currentThread().interrupt();
        }
    }

    private Map<String, Object> body(String namespace) {
        Map<String, Object> b = new LinkedHashMap<>();
        String ns = namespace != null ? namespace : this.namespace;
        if (ns != null) b.put("namespace", ns);
        return b;
    }

    private static String ms(Duration d) {
        return Long.toString(d.toMillis());
    }

    private long withWait(Duration wait) {
        return timeoutNanos + (wait == null ? 0 : wait.toNanos());
    }

    // ---------------------------------------------------------------- locks

    /**
     * Acquire: the grant, or {@link BusyException} (tried once: held by others), {@link WaitTimeoutException}
     * (waited {@code wait} in the server's queue), {@link DeadlockException}, {@link InvalidArgumentException}
     * naming the field. Without a holder the client makes one. Nothing renews the grant: for a lease kept while you
     * work, use {@link #lock}.
     */
    public Grant acquire(String name, LockOptions options) {
        try {
            return acquireGrants(name, null, options == null ? new LockOptions() : options, false).get(0);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Acquires 2 to 16 locks together for one holder, all or none: one grant per name in the order asked. */
    public List<Grant> acquireAll(List<String> names, LockOptions options) {
        try {
            return acquireGrants(null, names, options == null ? new LockOptions() : options, false);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    /** The Acquire behind every form; fills in {@code o.holder} when unset. */
    List<Grant> acquireGrants(String name, List<String> names, LockOptions o, boolean interruptible)
            throws InterruptedException {
        if (o.holder == null || o.holder.isEmpty()) o.holder = newHolder();
        Map<String, Object> b = body(o.namespace);
        if (names != null) b.put("names", new ArrayList<Object>(names));
        else b.put("name", requireName(name));
        b.put("holder", o.holder);
        if (o.ttl != null) b.put("ttlMs", ms(o.ttl));
        if (o.wait != null) b.put("waitMs", ms(o.wait));
        if (o.queueTtl != null) b.put("queueTtlMs", ms(o.queueTtl));
        if (o.limit != null) b.put("limit", o.limit);
        if (o.permits != null) b.put("permits", o.permits);
        if (o.kind != null) b.put("kind", o.kind);
        if (o.metadata != null) b.put("metadata", new LinkedHashMap<String, Object>(o.metadata));
        if (o.priority != null) b.put("priority", o.priority);
        if (o.fair != null) b.put("fair", o.fair);
        if (o.mode != null) b.put("mode", o.mode.wire());
        if (o.preferReaders) b.put("preferReaders", true);
        Map<String, Object> res = send("Acquire", b, withWait(o.wait), interruptible);
        String status = Json.str(res, "status");
        boolean already = status.equals("ACQUIRE_STATUS_ALREADY_HELD");
        if (already || status.equals("ACQUIRE_STATUS_ACQUIRED")) {
            List<Grant> out = new ArrayList<>();
            if (names != null) {
                for (Object g : Json.array(res.get("grants"))) out.add(Grant.fromJson(Json.object(g), null, already));
            } else {
                out.add(Grant.fromJson(Json.object(res.get("grant")), name, already));
            }
            return out;
        }
        String label = names != null ? String.join(",", names) : name;
        int holders = (int) Json.i64(res, "holders");
        if (Json.str(res, "reason").equals("NOT_ACQUIRED_REASON_TIMEOUT")) {
            throw new WaitTimeoutException(label + ": not acquired within the wait", holders,
                    (int) Json.i64(res, "queuePosition"));
        }
        throw new BusyException(label + ": held by others", holders);
    }

    private static String requireName(String name) {
        if (name == null) throw new IllegalArgumentException("name: a lock name is required");
        return name;
    }

    /** Release: true if released, false if the holder did not hold it (any more). {@code fencingToken} may be null. */
    public boolean release(String name, String holder, Long fencingToken) {
        return release(name, null, holder, fencingToken, null, null, timeoutNanos);
    }

    /** A multi-lock's set released by its holder, each lock pinned to its token when {@code tokens} is given. */
    public boolean releaseAll(List<String> names, String holder, List<Long> tokens) {
        return release(null, names, holder, null, tokens, null, timeoutNanos);
    }

    boolean release(String name, List<String> names, String holder, Long token, List<Long> tokens, String ns,
                    long timeout) {
        Map<String, Object> b = body(ns);
        if (names != null) b.put("names", new ArrayList<Object>(names));
        else b.put("name", requireName(name));
        b.put("holder", holder);
        if (token != null) b.put("fencingToken", Long.toUnsignedString(token));
        if (tokens != null) b.put("fencingTokens", stringsOf(tokens));
        return Json.str(call("Release", b, timeout), "status").equals("RELEASE_STATUS_RELEASED");
    }

    private static List<Object> stringsOf(List<Long> tokens) {
        List<Object> l = new ArrayList<>();
        for (Long t : tokens) l.add(Long.toUnsignedString(t));
        return l;
    }

    /**
     * Extend: the renewed grant (its lease {@code ttl} from the server's now; null: the grant's own), or
     * {@link NotHeldException} when the holder does not hold it (with that token).
     */
    public Grant extend(String name, String holder, Duration ttl, Long fencingToken) {
        return extend(name, null, holder, ttl, fencingToken, null, null, timeoutNanos);
    }

    /** A set's leases renewed together; the grant whose lease now ends first. */
    public Grant extendAll(List<String> names, String holder, Duration ttl, List<Long> tokens) {
        return extend(null, names, holder, ttl, null, tokens, null, timeoutNanos);
    }

    Grant extend(String name, List<String> names, String holder, Duration ttl, Long token, List<Long> tokens,
                 String ns, long timeout) {
        Map<String, Object> b = body(ns);
        if (names != null) b.put("names", new ArrayList<Object>(names));
        else b.put("name", requireName(name));
        b.put("holder", holder);
        if (ttl != null) b.put("ttlMs", ms(ttl));
        if (token != null) b.put("fencingToken", Long.toUnsignedString(token));
        if (tokens != null) b.put("fencingTokens", stringsOf(tokens));
        Map<String, Object> res = call("Extend", b, timeout);
        if (Json.str(res, "status").equals("EXTEND_STATUS_EXTENDED")) {
            return Grant.fromJson(Json.object(res.get("grant")), name, false);
        }
        String label = names != null ? String.join(",", names) : name;
        throw new NotHeldException("Extend", label + ": not held by " + holder);
    }

    /** Who holds the lock, its limit and mode, and how many wait. */
    public LockInfo inspect(String name) {
        Map<String, Object> b = body(null);
        b.put("name", requireName(name));
        return LockInfo.fromJson(call("Inspect", b, timeoutNanos), name);
    }

    /** The holders of the lock's waiting requests, from the head of its queue (position 1 is granted next). */
    public List<String> queue(String name) {
        Map<String, Object> b = body(null);
        b.put("name", requireName(name));
        List<String> out = new ArrayList<>();
        for (Object r : Json.array(call("Queue", b, timeoutNanos).get("requests"))) {
            out.add(Json.str(Json.object(r), "holder"));
        }
        return out;
    }

    // ---------------------------------------------------------------- guards and java.util.concurrent forms

    /**
     * Acquires (waiting {@code options.wait}, else trying once) and returns a guard whose watchdog extends the
     * lease each third of it while the guard is open; close it (try-with-resources) to release.
     */
    public HeldLock lock(String name, LockOptions options) {
        try {
            return held(name, null, options == null ? new LockOptions() : options.copy(), false);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    /** As {@link #lock}, but an interrupt stops the wait (the server drops the request from its queue). */
    public HeldLock lockInterruptibly(String name, LockOptions options) throws InterruptedException {
        return held(name, null, options == null ? new LockOptions() : options.copy(), true);
    }

    /** A multi-lock's guard: every lock of the set or none, one watchdog for the set. */
    public HeldLock lockAll(List<String> names, LockOptions options) {
        try {
            return held(null, names, options == null ? new LockOptions() : options.copy(), false);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    HeldLock held(String name, List<String> names, LockOptions o, boolean interruptible) throws InterruptedException {
        boolean madeHere = o.holder == null || o.holder.isEmpty();
        long start = System.nanoTime();
        List<Grant> grants = acquireGrants(name, names, o, interruptible);
        HeldLock h = new HeldLock(this, name, names == null ? null : List.copyOf(names), grants,
                o.namespace, o.limit, o.kind);
        return h.countLease(start, madeHere);
    }

    /** A {@link java.util.concurrent.locks.Lock} on {@code name} (a mutex; lease 30 s, kept by the watchdog). */
    public TumblerLock getLock(String name) {
        return new TumblerLock(this, name, null, new LockOptions());
    }

    /** A {@link java.util.concurrent.locks.Lock} with these options (ttl, limit, permits, kind, metadata, ...). */
    public TumblerLock getLock(String name, LockOptions options) {
        return new TumblerLock(this, name, null, options.copy());
    }

    /** A Lock on 2 to 16 names at once: all or none, one holder per thread. */
    public TumblerLock getMultiLock(String... names) {
        return new TumblerLock(this, null, Arrays.asList(names), new LockOptions());
    }

    /** A semaphore of {@code limit} permits on {@code name}. */
    public TumblerSemaphore getSemaphore(String name, int limit) {
        return new TumblerSemaphore(this, name, limit, new LockOptions());
    }

    /** A {@link java.util.concurrent.locks.ReadWriteLock} on {@code name}. */
    public TumblerReadWriteLock getReadWriteLock(String name) {
        return new TumblerReadWriteLock(this, name, new LockOptions());
    }

    // ---------------------------------------------------------------- leader election

    /**
     * Campaigns to lead the election {@code name}, showing {@code value}, waiting up to {@code options.wait} (unset:
     * try once). Options: holder (the candidate; unset: made here), ttl (the leadership's lease; default 15 s),
     * queueTtl, kind. A {@link Leadership} (its watchdog keeps the lease; it holds the secret Proclaim and Resign
     * need), or empty when not elected within the wait.
     */
    public Optional<Leadership> campaign(String name, String value, LockOptions options) {
        try {
            return campaign(name, value, options == null ? new LockOptions() : options.copy(), false);
        } catch (InterruptedException e) {
            throw new IllegalStateException(e);
        }
    }

    /** As {@link #campaign(String, String, LockOptions)}; an interrupt withdraws the candidacy. */
    public Optional<Leadership> campaignInterruptibly(String name, String value, LockOptions options)
            throws InterruptedException {
        return campaign(name, value, options == null ? new LockOptions() : options.copy(), true);
    }

    private Optional<Leadership> campaign(String name, String value, LockOptions o, boolean interruptible)
            throws InterruptedException {
        boolean madeHere = o.holder == null || o.holder.isEmpty();
        if (madeHere) o.holder = newHolder();
        if (o.ttl == null) o.ttl = Duration.ofSeconds(15);
        if (o.wait == null) o.wait = Duration.ZERO;
        Map<String, Object> b = body(o.namespace);
        b.put("name", requireName(name));
        b.put("candidate", o.holder);
        b.put("value", value == null ? "" : value);
        b.put("ttlMs", ms(o.ttl));
        b.put("waitMs", ms(o.wait));
        if (o.queueTtl != null) b.put("queueTtlMs", ms(o.queueTtl));
        if (o.kind != null) b.put("kind", o.kind);
        long start = System.nanoTime();
        Map<String, Object> res = send("Campaign", b, withWait(o.wait), interruptible);
        if (!Json.bool(res, "elected")) return Optional.empty();
        Leader leader = Leader.fromJson(res.get("leader"), name);
        Leadership l = new Leadership(this, name, o.namespace, leader, Json.str(res, "secret"));
        l.countLease(start, madeHere);
        return Optional.of(l);
    }

    /** The election's leader now; null when nobody leads. */
    public Leader leader(String name) {
        Map<String, Object> b = body(null);
        b.put("name", requireName(name));
        return Leader.fromJson(call("Leader", b, timeoutNanos).get("leader"), name);
    }

    /** Proclaim a new value for a leadership (candidate, term and the secret its Campaign returned). */
    public Leader proclaim(String name, String candidate, long term, String secret, String value) {
        return proclaim(name, null, candidate, term, secret, value);
    }

    Leader proclaim(String name, String ns, String candidate, long term, String secret, String value) {
        Map<String, Object> b = body(ns);
        b.put("name", requireName(name));
        b.put("candidate", candidate);
        b.put("term", Long.toUnsignedString(term));
        b.put("value", value == null ? "" : value);
        b.put("secret", secret == null ? "" : secret);
        Map<String, Object> res = call("Proclaim", b, timeoutNanos);
        if (Json.str(res, "status").equals("PROCLAIM_STATUS_PROCLAIMED")) return Leader.fromJson(res.get("leader"), name);
        throw new NotLeaderException("Proclaim", name + ": " + candidate + " does not lead with term " + term,
                "not the leader");
    }

    /** Resign a leadership: true if this ended the term, false when it was over already. */
    public boolean resign(String name, String candidate, long term, String secret) {
        return resign(name, null, candidate, term, secret, timeoutNanos);
    }

    boolean resign(String name, String ns, String candidate, long term, String secret, long timeout) {
        Map<String, Object> b = body(ns);
        b.put("name", requireName(name));
        b.put("candidate", candidate);
        b.put("term", Long.toUnsignedString(term));
        b.put("secret", secret == null ? "" : secret);
        return Json.str(call("Resign", b, timeout), "status").equals("RESIGN_STATUS_RESIGNED");
    }

    /** A Curator-like {@link LeaderLatch} on the election {@code name}; {@link LeaderLatch#start()} it. */
    public LeaderLatch leaderLatch(String name, String value) {
        return new LeaderLatch(this, name, value, null, Duration.ofSeconds(15));
    }

    /**
     * Observes an election: calls {@code onChange} with each change as it happens (the first is the current leader,
     * event {@code current}) until it returns false, or {@code timeout} passes (then returns). A Connect server
     * stream on a connection of its own; throws a {@link TumblerException} when the stream fails.
     */
    public void observe(String name, Predicate<LeaderChange> onChange, Duration timeout) {
        Map<String, Object> b = body(null);
        b.put("name", requireName(name));
        byte[] json = Json.write(b).getBytes(StandardCharsets.UTF_8);
        byte[] env = new byte[5 + json.length];
        env[1] = (byte) (json.length >>> 24);
        env[2] = (byte) (json.length >>> 16);
        env[3] = (byte) (json.length >>> 8);
        env[4] = (byte) json.length;
        System.arraycopy(json, 0, env, 5, json.length);
        HttpRequest.Builder rb = HttpRequest.newBuilder(URI.create(endpoint + SERVICE + "Observe"))
                .timeout(timeout)
                .header("content-type", "application/connect+json")
                .header("connect-protocol-version", "1")
                .POST(HttpRequest.BodyPublishers.ofByteArray(env));
        if (authorization != null) rb.header("authorization", authorization);
        HttpResponse<InputStream> res;
        try {
            res = http().send(rb.build(), HttpResponse.BodyHandlers.ofInputStream());
        } catch (HttpTimeoutException e) {
            return;
        } catch (IOException e) {
            throw new UnavailableException("Observe", 0, e.toString(), 1);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            return;
        }
        InputStream body = res.body();
        java.util.concurrent.ScheduledFuture<?> closer = timer.schedule(() -> {
            try {
                body.close(); // the timeout passed: the connection closes, the server ends the stream
            } catch (IOException ignored) {
                // closed already
            }
        }, timeout.toNanos(), java.util.concurrent.TimeUnit.NANOSECONDS);
        try (InputStream in = body) {
            if (res.statusCode() != 200) {
                String text = new String(in.readAllBytes(), StandardCharsets.UTF_8);
                String code = null;
                String message = "HTTP " + res.statusCode();
                try {
                    Map<String, Object> err = Json.object(Json.parse(text));
                    code = (String) err.get("code");
                    message = Json.str(err, "message");
                } catch (IllegalArgumentException | ClassCastException e) {
                    // not Connect's error body
                }
                throw TumblerException.fromConnect(code, message, res.statusCode(), "Observe", 1);
            }
            byte[] head = new byte[5];
            while (true) {
                if (in.readNBytes(head, 0, 5) < 5) return;
                int len = ((head[1] & 0xff) << 24) | ((head[2] & 0xff) << 16) | ((head[3] & 0xff) << 8) | (head[4] & 0xff);
                String text = new String(in.readNBytes(len), StandardCharsets.UTF_8);
                Map<String, Object> m = Json.object(Json.parse(text));
                if ((head[0] & 0x02) != 0) {
                    Map<String, Object> err = Json.object(m.get("error"));
                    if (err.isEmpty()) return;
                    throw TumblerException.fromConnect(Json.str(err, "code"), Json.str(err, "message"), 200,
                            "Observe", 1);
                }
                LeaderChange change = new LeaderChange(Json.str(m, "event"), Leader.fromJson(m.get("leader"), name),
                        Json.i64(m, "atMs"), Json.i64(m, "endedTerm"));
                if (!onChange.test(change)) return;
            }
        } catch (IOException e) {
            if (!closer.isDone()) throw new UnavailableException("Observe", 0, e.toString(), 1);
        } finally {
            closer.cancel(false);
        }
    }
}
