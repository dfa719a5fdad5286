// Java's steps of the cross-language conformance scenario (clients/conformance),
// run with the built tumbler-client jar on the class path.
// usage: java -cp tumbler-client.jar:tumbler-conformance.jar ConformanceSteps ADDR NAMESPACE STEP ARGS...
// Prints JSON lines: events ({"event": ...}) while it runs, its result last.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import tumbler.client.BusyException;
import tumbler.client.DeadlockException;
import tumbler.client.Grant;
import tumbler.client.HeldLock;
import tumbler.client.InvalidArgumentException;
import tumbler.client.LeaderChange;
import tumbler.client.Leader;
import tumbler.client.Leadership;
import tumbler.client.LockInfo;
import tumbler.client.LockLostException;
import tumbler.client.LockMode;
import tumbler.client.LockOptions;
import tumbler.client.NotAcquiredException;
import tumbler.client.NotLeaderException;
import tumbler.client.PermissionDeniedException;
import tumbler.client.TumblerClient;
import tumbler.client.TumblerException;
import tumbler.client.TumblerLock;
import tumbler.client.WaitTimeoutException;

public final class ConformanceSteps {
    static String addr;
    static String namespace;

    public static void main(String[] argv) throws Exception {
        addr = argv[0];
        namespace = argv[1];
        String step = argv[2];
        String[] a = Arrays.copyOfRange(argv, 3, argv.length);
        Object out;
        if (step.equals("auth")) {
            out = auth(a[0]);
        } else {
            try (TumblerClient c = client(namespace, null)) {
                out = run(c, step, a);
            }
        }
        emit(out);
        System.exit(0);
    }

    static TumblerClient client(String ns, String token) {
        return TumblerClient.builder().endpoint("http://" + addr).namespace(ns).token(token).build();
    }

    static Object run(TumblerClient c, String step, String[] a) throws Exception {
        switch (step) {
            case "hold": return hold(c, a[0], a[1], Integer.parseInt(a[2]));
            case "release": return map("released", c.release(a[0], a[1], null));
            case "wait": return waitStep(c, a[0], a[1], null, ms(a[2]), ms(a[3]));
            case "rw_hold": return rwHold(c, a[0], a[1], a[2]);
            case "rw_wait": return waitStep(c, a[0], a[1], mode(a[2]), ms(a[3]), ms(a[4]));
            case "weighted_hold": return weightedHold(c, a[0], a[1], Integer.parseInt(a[2]), Integer.parseInt(a[3]));
            case "weighted_wait": return weightedWait(c, a[0], a[1], Integer.parseInt(a[2]), Integer.parseInt(a[3]),
                    ms(a[4]), ms(a[5]));
            case "multi_hold": return multiHold(c, a[0], a[1]);
            case "multi_wait": return multiWait(c, a[0], a[1], ms(a[2]), ms(a[3]));
            case "multi_release": return map("released", c.releaseAll(names(a[1]), a[0], null));
            case "multi_stale": return multiStale(c, a[0], a[1]);
            case "deadlock_wait": return deadlockWait(c, a[0], a[1], ms(a[2]));
            case "scoped": return scoped(c, a[0]);
            case "inspect": return inspect(c, a[0]);
            case "invalid": return invalid(c);
            case "keep": return keep(c, a[0], Long.parseLong(a[1]), Long.parseLong(a[2]));
            case "crash": return crash(c, a[0], Long.parseLong(a[1]));
            case "lost": return lost(c, a[0], Long.parseLong(a[1]));
            case "cancel": return cancel(c, a[0], Long.parseLong(a[1]));
            case "restart": return restart(c, a[0], a[1], ms(a[2]));
            case "campaign": return campaign(c, a[0], a[1], a[2], ms(a[3]), ms(a[4]));
            case "leader": return map("leader", leaderJson(c.leader(a[0])));
            case "observe": return observe(c, a[0], a[1], ms(a[2]));
            default: throw new IllegalArgumentException("unknown step " + step);
        }
    }

    // ------------------------------------------------------------------ helpers

    static Duration ms(String s) {
        return Duration.ofMillis(Long.parseLong(s));
    }

    static List<String> names(String s) {
        return Arrays.asList(s.split(","));
    }

    static LockMode mode(String s) {
        return s.equals("read") ? LockMode.READ : s.equals("write") ? LockMode.WRITE : null;
    }

    static long now() {
        return System.currentTimeMillis();
    }

    static Map<String, Object> map(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    static Map<String, Object> grantJson(Grant g) {
        return map("holder", g.holder(), "token", Long.toString(g.fencingToken()), "slot", g.slot(),
                "acquired_at_ms", g.acquiredAtMs());
    }

    static Map<String, Object> weights(Grant g) {
        return map("permits", g.permits(), "slots", new ArrayList<Object>(g.slots()));
    }

    static Map<String, Object> error(TumblerException e) {
        if (e instanceof NotAcquiredException) {
            NotAcquiredException n = (NotAcquiredException) e;
            return map("status", n instanceof BusyException ? "BUSY" : "TIMEOUT", "holders", n.holders());
        }
        if (e instanceof DeadlockException) {
            return map("status", "DEADLOCK", "code", e.code(), "typed", e.getClass().getSimpleName(),
                    "message", e.getMessage());
        }
        return map("status", "ERROR", "code", e.code(), "typed", e.getClass().getSimpleName(),
                "message", e.getMessage());
    }

    static void sleep(Duration d) throws InterruptedException {
        Thread.sleep(d.toMillis());
    }

    // ------------------------------------------------------------------ steps

    static Object hold(TumblerClient c, String name, String holder, int limit) {
        try {
            Grant g = c.acquire(name, new LockOptions().holder(holder).limit(limit).ttl(Duration.ofSeconds(60)));
            Map<String, Object> out = map("status", "ACQUIRED");
            out.putAll(grantJson(g));
            return out;
        } catch (NotAcquiredException e) {
            return error(e);
        }
    }

    static Object rwHold(TumblerClient c, String name, String holder, String mode) {
        try {
            Grant g = c.acquire(name, new LockOptions().holder(holder).ttl(Duration.ofSeconds(60)).mode(mode(mode)));
            Map<String, Object> out = map("status", "ACQUIRED");
            out.putAll(grantJson(g));
            out.put("mode", g.mode() == null ? null : g.mode().name());
            return out;
        } catch (TumblerException e) {
            return error(e);
        }
    }

    static Object weightedHold(TumblerClient c, String name, String holder, int limit, int permits) {
        try {
            Grant g = c.acquire(name, new LockOptions().holder(holder).ttl(Duration.ofSeconds(60)).limit(limit)
                    .permits(permits));
            Map<String, Object> out = map("status", "ACQUIRED");
            out.putAll(grantJson(g));
            out.putAll(weights(g));
            return out;
        } catch (TumblerException e) {
            return error(e);
        }
    }

    /** Waits (in a mode, or plain), holds a while, releases (try-with-resources). */
    static Object waitStep(TumblerClient c, String name, String holder, LockMode mode, Duration wait, Duration hold)
            throws InterruptedException {
        Map<String, Object> out;
        try (HeldLock lock = c.lock(name, new LockOptions().holder(holder).wait(wait).ttl(Duration.ofSeconds(60))
                .mode(mode))) {
            out = grantJson(lock.grant());
            if (mode != null) out.put("mode", lock.mode().name());
            sleep(hold);
            out.put("released_at_ms", now());
        }
        return out;
    }

    static Object weightedWait(TumblerClient c, String name, String holder, int limit, int permits, Duration wait,
                               Duration hold) throws InterruptedException {
        Map<String, Object> out;
        try (HeldLock lock = c.lock(name, new LockOptions().holder(holder).wait(wait).ttl(Duration.ofSeconds(60))
                .limit(limit).permits(permits))) {
            out = grantJson(lock.grant());
            out.putAll(weights(lock.grant()));
            lock.extend();
            out.put("extended", weights(lock.grant()));
            sleep(hold);
            out.put("released_at_ms", now());
        }
        return out;
    }

    static Map<String, Object> setJson(HeldLock set) {
        List<Object> grants = new ArrayList<>();
        for (Grant g : set.grants()) {
            grants.add(map("name", g.name(), "token", Long.toString(g.fencingToken()), "slot", g.slot()));
        }
        return map("status", "ACQUIRED", "holder", set.holder(), "grants", grants);
    }

    static Object multiHold(TumblerClient c, String holder, String names) {
        try {
            List<Grant> grants = c.acquireAll(names(names), new LockOptions().holder(holder)
                    .ttl(Duration.ofSeconds(60)));
            List<Object> out = new ArrayList<>();
            for (Grant g : grants) {
                out.add(map("name", g.name(), "token", Long.toString(g.fencingToken()), "slot", g.slot()));
            }
            return map("status", "ACQUIRED", "holder", grants.get(0).holder(), "grants", out);
        } catch (TumblerException e) {
            return error(e);
        }
    }

    static Object multiWait(TumblerClient c, String holder, String names, Duration wait, Duration hold)
            throws InterruptedException {
        try (HeldLock set = c.lockAll(names(names), new LockOptions().holder(holder).wait(wait)
                .ttl(Duration.ofSeconds(60)))) {
            Map<String, Object> out = setJson(set);
            try {
                set.extend();
                out.put("extended", true);
            } catch (LockLostException e) {
                out.put("extended", false);
            }
            sleep(hold);
            out.put("released_at_ms", now());
            return out;
        } catch (TumblerException e) {
            return error(e);
        }
    }

    static Object multiStale(TumblerClient c, String holder, String names) throws Exception {
        LockOptions o = new LockOptions().holder(holder).ttl(Duration.ofSeconds(60));
        HeldLock first = c.lockAll(names(names), o);
        boolean firstReleased = first.release();
        HeldLock second = c.lockAll(names(names), o);
        boolean stale = c.releaseAll(names(names), holder, first.fencingTokens());
        emit(map("event", "stale", "first", setJson(first), "second", setJson(second), "first_released", firstReleased,
                "stale_released", stale));
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)).readLine();
        return map("released", second.release());
    }

    static Object deadlockWait(TumblerClient c, String name, String holder, Duration wait) {
        try {
            Grant g = c.acquire(name, new LockOptions().holder(holder).wait(wait).ttl(Duration.ofSeconds(60)));
            c.release(name, holder, g.fencingToken());
            return map("status", "ACQUIRED", "token", Long.toString(g.fencingToken()));
        } catch (TumblerException e) {
            return error(e);
        }
    }

    static Object scoped(TumblerClient c, String name) throws InterruptedException {
        Map<String, Object> out;
        try (HeldLock lock = c.lock(name, new LockOptions().ttl(Duration.ofMillis(2000)))) {
            out = grantJson(lock.grant());
            long before = lock.grant().expiresAtMs();
            Thread.sleep(50);
            lock.extend(Duration.ofSeconds(30));
            out.put("extended", lock.grant().expiresAtMs() > before);
        }
        out.put("holders_after", c.inspect(name).holders().size());
        return out;
    }

    static Object inspect(TumblerClient c, String name) {
        LockInfo info = c.inspect(name);
        List<Object> holders = new ArrayList<>();
        for (Grant g : info.holders()) {
            holders.add(map("holder", g.holder(), "token", Long.toString(g.fencingToken()), "slot", g.slot()));
        }
        return map("limit", info.limit(), "waiters", info.waiters(), "holders", holders, "queue",
                new ArrayList<Object>(c.queue(name)));
    }

    /** Bad input: a name of 600 bytes (the most is 512). */
    static Object invalid(TumblerClient c) {
        try {
            c.acquire("x".repeat(600), new LockOptions());
            return map("field", "name", "code", "OK");
        } catch (InvalidArgumentException e) {
            return map("field", e.field(), "code", e.code(), "message", e.getMessage(), "typed",
                    e.getClass().getSimpleName());
        }
    }

    /** A lease shorter than the work, through java.util.concurrent.locks.Lock: the watchdog keeps it. */
    static Object keep(TumblerClient c, String name, long ttl, long work) throws InterruptedException {
        TumblerLock lock = c.getLock(name, new LockOptions().ttl(Duration.ofMillis(ttl)));
        lock.lock();
        String holder = lock.holderForCurrentThread();
        Map<String, Object> out;
        try {
            emit(mapWith("event", "held", grantJson(lock.heldLock().grant())));
            long start = now();
            Thread.sleep(work);
            out = map("body_start_ms", start, "body_end_ms", now(), "token", Long.toString(lock.fencingToken()),
                    "lost", !lock.isHeldByCurrentThread());
            List<Grant> holders = c.inspect(name).holders();
            out.put("token_inside", holders.isEmpty() ? null : Long.toString(holders.get(0).fencingToken()));
        } finally {
            lock.unlock();
        }
        // Its own grant only: the driver's prober may take the freed lock at once.
        out.put("holders_after", c.inspect(name).holders().stream().filter(g -> g.holder().equals(holder)).count());
        return out;
    }

    static Map<String, Object> mapWith(String k, Object v, Map<String, Object> rest) {
        Map<String, Object> m = map(k, v);
        m.putAll(rest);
        return m;
    }

    static Object crash(TumblerClient c, String name, long ttl) throws InterruptedException {
        try (HeldLock lock = c.lock(name, new LockOptions().holder("java-crasher").ttl(Duration.ofMillis(ttl)))) {
            emit(mapWith("event", "held", grantJson(lock.grant())));
            Thread.sleep(60_000);
        }
        return map("survived", true);
    }

    /** The grant is taken away: the onLost listener hears it, close() throws LockLostException. */
    static Object lost(TumblerClient c, String name, long ttl) throws InterruptedException {
        Map<String, Object> out = map("signalled", false);
        CountDownLatch signal = new CountDownLatch(1);
        AtomicLong at = new AtomicLong();
        try (HeldLock lock = c.lock(name, new LockOptions().holder("java-loser").ttl(Duration.ofMillis(ttl)))) {
            lock.onLost(e -> {
                at.set(now());
                signal.countDown();
            });
            emit(mapWith("event", "held", grantJson(lock.grant())));
            if (signal.await(10, TimeUnit.SECONDS)) {
                out.put("signalled", true);
                out.put("signal_at_ms", at.get());
                out.put("reason", lock.lostReason());
            }
        } catch (LockLostException e) {
            out.put("raised", e.getClass().getSimpleName());
        }
        return out;
    }

    /** A waiting acquire on another thread, interrupted: InterruptedException, the request leaves the queue. */
    static Object cancel(TumblerClient c, String name, long afterMs) throws Exception {
        String holder = "java-canceller";
        AtomicReference<String> error = new AtomicReference<>("none");
        AtomicLong endedAt = new AtomicLong();
        Thread waiter = new Thread(() -> {
            try {
                c.lockInterruptibly(name, new LockOptions().holder(holder).wait(Duration.ofSeconds(20))
                        .ttl(Duration.ofSeconds(10))).release();
                error.set("acquired");
            } catch (InterruptedException e) {
                error.set("InterruptedException");
            } catch (RuntimeException e) {
                error.set(e.toString());
            }
            endedAt.set(System.nanoTime());
        });
        waiter.start();
        Thread.sleep(Math.max(0, afterMs - 100));
        boolean queuedBefore = c.queue(name).contains(holder);
        Thread.sleep(Math.min(100, afterMs));
        long t0 = System.nanoTime();
        waiter.interrupt();
        waiter.join(5000);
        Map<String, Object> out = map("error", error.get(), "cancel_ms", (endedAt.get() - t0) / 1_000_000,
                "queued_before", queuedBefore);
        while (true) {
            List<String> queue = c.queue(name);
            out.put("queue_after", queue);
            out.put("gone_ms", (System.nanoTime() - t0) / 1_000_000);
            if (!queue.contains(holder) || System.nanoTime() - t0 > 2_000_000_000L) return out;
            Thread.sleep(10);
        }
    }

    static Object restart(TumblerClient c, String name, String holder, Duration wait) {
        long started = System.nanoTime();
        HeldLock lock = c.lock(name, new LockOptions().holder(holder).wait(wait).ttl(Duration.ofSeconds(30)));
        Map<String, Object> out = mapWith("status", "ACQUIRED", grantJson(lock.grant()));
        out.put("elapsed_ms", (System.nanoTime() - started) / 1_000_000);
        lock.release();
        return out;
    }

    static Map<String, Object> leaderJson(Leader l) {
        if (l == null) return null;
        return map("candidate", l.candidate(), "term", Long.toString(l.term()), "value", l.value(),
                "elected_at_ms", l.electedAtMs(), "expires_at_ms", l.expiresAtMs());
    }

    /** Campaign, then act on commands from stdin (the watchdog keeps the lease meanwhile). */
    static Object campaign(TumblerClient c, String name, String candidate, String value, Duration ttl, Duration wait)
            throws Exception {
        Optional<Leadership> won = c.campaign(name, value, new LockOptions().holder(candidate).ttl(ttl).wait(wait));
        if (won.isEmpty()) return map("elected", false);
        Leadership held = won.get();
        CountDownLatch lostSignal = new CountDownLatch(1);
        held.onLost(e -> lostSignal.countDown());
        emit(mapWith("event", "elected", mapWith("elected", true, mapWith("at_ms", now(), leaderJson(held.leader())))));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.trim().split(" ", 2);
            String cmd = parts[0];
            String arg = parts.length > 1 ? parts[1] : "";
            if (cmd.equals("proclaim")) {
                try {
                    held.proclaim(arg);
                    emit(map("event", "proclaim", "status", "PROCLAIMED", "value", held.value(), "lost", held.isLost()));
                } catch (NotLeaderException e) {
                    emit(map("event", "proclaim", "status", "NOT_LEADER", "typed", e.getClass().getSimpleName(),
                            "lost", held.isLost()));
                }
            } else if (cmd.equals("resign")) {
                boolean first = held.resign();
                boolean second = held.resign();
                emit(map("event", "resign", "first", first, "second", second, "lost", held.isLost()));
            } else if (cmd.equals("lost")) {
                boolean lost = lostSignal.await(Long.parseLong(arg), TimeUnit.MILLISECONDS) || held.isLost();
                emit(map("event", "lost", "lost", lost, "reason", held.lostReason(), "at_ms", now()));
            } else if (cmd.equals("exit")) {
                break;
            }
        }
        try {
            held.resign();
        } catch (TumblerException e) {
            // its lease ends by itself
        }
        return map("done", true, "term", Long.toString(held.term()));
    }

    static Object observe(TumblerClient c, String name, String stopCandidate, Duration timeout) {
        List<Object> changes = new ArrayList<>();
        boolean[] cancelled = {false};
        Map<String, Object> out = map();
        try {
            c.observe(name, (LeaderChange change) -> {
                Map<String, Object> seen = map("kind", change.event(), "leader", leaderJson(change.leader()),
                        "ended_term", Long.toString(change.endedTerm()));
                changes.add(seen);
                emit(mapWith("event", "change", seen));
                if (change.event().equals("elected") && change.leader() != null
                        && change.leader().candidate().equals(stopCandidate)) {
                    cancelled[0] = true;
                    return false;
                }
                return true;
            }, timeout);
        } catch (TumblerException e) {
            out.put("error", e.toString());
        }
        out.put("cancelled", cancelled[0]);
        out.put("changes", changes);
        return out;
    }

    /** The token is sent; none, or another namespace, is PermissionDeniedException. */
    static Object auth(String token) {
        return map("with_token", attempt(namespace, token), "no_token", attempt(namespace, null),
                "other_namespace", attempt("elsewhere", token));
    }

    static String attempt(String ns, String token) {
        try (TumblerClient c = client(ns, token)) {
            c.lock("auth-java", new LockOptions().ttl(Duration.ofSeconds(5))).release();
            return "ACQUIRED";
        } catch (PermissionDeniedException e) {
            return "PermissionDeniedException";
        } catch (TumblerException e) {
            return e.getClass().getSimpleName();
        }
    }

    // ------------------------------------------------------------------ JSON out

    static synchronized void emit(Object o) {
        StringBuilder sb = new StringBuilder();
        json(sb, o);
        System.out.println(sb);
        System.out.flush();
    }

    @SuppressWarnings("unchecked")
    static void json(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof String) {
            sb.append('"');
            for (char ch : ((String) v).toCharArray()) {
                if (ch == '"' || ch == '\\') sb.append('\\').append(ch);
                else if (ch < 0x20) sb.append(String.format("\\u%04x", (int) ch));
                else sb.append(ch);
            }
            sb.append('"');
        } else if (v instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                if (!first) sb.append(',');
                first = false;
                json(sb, e.getKey());
                sb.append(':');
                json(sb, e.getValue());
            }
            sb.append('}');
        } else if (v instanceof List) {
            sb.append('[');
            boolean first = true;
            for (Object o : (List<Object>) v) {
                if (!first) sb.append(',');
                first = false;
                json(sb, o);
            }
            sb.append(']');
        } else {
            sb.append(v);
        }
    }

    private ConformanceSteps() {}
}
