package tumbler.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

/** The client against a real redis-server and a real `tumbler serve` (no auth), started once for the class. */
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class ClientTest {
    Servers servers;
    String endpoint;
    TumblerClient client;
    TumblerClient other;

    @BeforeAll
    void start() throws Exception {
        servers = new Servers();
        endpoint = "http://127.0.0.1:" + servers.serve("--no-auth");
        client = TumblerClient.builder().endpoint(endpoint).namespace("java-test").build();
        other = TumblerClient.builder().endpoint(endpoint).namespace("java-test").build();
    }

    @AfterAll
    void stop() throws Exception {
        client.close();
        other.close();
        servers.close();
    }

    @Test
    void jsonRoundTrip() {
        Object v = Json.parse("{\"a\":\"x\\\"y\\u00e9\",\"b\":[1,2.5,true,null],\"c\":{\"d\":\"18446744073709551615\"}}");
        Map<String, Object> m = Json.object(v);
        assertEquals("x\"y\u00e9", m.get("a"));
        assertEquals(Arrays.asList(1L, 2.5, true, null), m.get("b"));
        assertEquals(-1L, Json.i64(Json.object(m.get("c")), "d"));
        assertEquals("{\"a\":\"x\\\"y\u00e9\",\"b\":[1,2.5,true,null],\"c\":{\"d\":\"18446744073709551615\"}}",
                Json.write(v));
        assertThrows(IllegalArgumentException.class, () -> Json.parse("{\"a\":"));
    }

    @Test
    void lockInterfaceIsReentrantPerThreadAndExclusiveAcrossClients() throws Exception {
        TumblerLock mine = client.getLock("lock-iface");
        TumblerLock theirs = other.getLock("lock-iface");
        mine.lock();
        assertTrue(mine.tryLock());
        assertEquals(2, mine.getHoldCount());
        long token = mine.fencingToken();
        AtomicReference<Boolean> got = new AtomicReference<>();
        Thread t = new Thread(() -> got.set(theirs.tryLock()));
        t.start();
        t.join();
        assertFalse(got.get(), "another client's tryLock while held");
        // Another thread of the same client is another holder too.
        Thread t2 = new Thread(() -> got.set(mine.tryLock()));
        t2.start();
        t2.join();
        assertFalse(got.get(), "another thread's tryLock while held");
        mine.unlock();
        assertTrue(mine.isHeldByCurrentThread());
        mine.unlock();
        assertFalse(mine.isHeldByCurrentThread());
        assertFalse(mine.isLocked());
        assertThrows(IllegalMonitorStateException.class, mine::unlock);
        assertThrows(UnsupportedOperationException.class, mine::newCondition);
        assertTrue(theirs.tryLock(1, TimeUnit.SECONDS));
        assertTrue(theirs.fencingToken() > token);
        theirs.unlock();
    }

    @Test
    void tryLockWaitsInTheServersQueue() throws Exception {
        HeldLock held = client.lock("queued", new LockOptions().ttl(Duration.ofSeconds(10)));
        TumblerLock waiter = other.getLock("queued");
        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<Boolean> got = new AtomicReference<>();
        Thread t = new Thread(() -> {
            try {
                got.set(waiter.tryLock(5, TimeUnit.SECONDS));
                if (got.get()) waiter.unlock();
            } catch (InterruptedException e) {
                got.set(null);
            }
            done.countDown();
        });
        t.start();
        long until = System.nanoTime() + 5_000_000_000L;
        while (client.queue("queued").isEmpty() && System.nanoTime() < until) Thread.sleep(10);
        assertEquals(1, client.queue("queued").size(), "waits in the server's queue");
        held.close();
        assertTrue(done.await(5, TimeUnit.SECONDS));
        assertTrue(got.get());
    }

    @Test
    void lockInterruptiblyLeavesTheQueueOnInterrupt() throws Exception {
        HeldLock held = client.lock("interrupted", new LockOptions().ttl(Duration.ofSeconds(10)));
        TumblerLock waiter = other.getLock("interrupted");
        AtomicReference<Throwable> thrown = new AtomicReference<>();
        Thread t = new Thread(() -> {
            try {
                waiter.lockInterruptibly();
            } catch (Throwable e) {
                thrown.set(e);
            }
        });
        t.start();
        long until = System.nanoTime() + 5_000_000_000L;
        while (client.queue("interrupted").isEmpty() && System.nanoTime() < until) Thread.sleep(10);
        assertEquals(1, client.queue("interrupted").size());
        long t0 = System.nanoTime();
        t.interrupt();
        t.join(2000);
        assertTrue(thrown.get() instanceof InterruptedException, String.valueOf(thrown.get()));
        assertTrue(System.nanoTime() - t0 < 500_000_000L, "the wait stopped at once");
        until = System.nanoTime() + 2_000_000_000L;
        while (!client.queue("interrupted").isEmpty() && System.nanoTime() < until) Thread.sleep(10);
        assertTrue(client.queue("interrupted").isEmpty(), "the request left the server's queue");
        held.close();
        assertTrue(client.inspect("interrupted").holders().isEmpty(), "no ghost waiter was granted it");
    }

    @Test
    void watchdogKeepsAShortLeaseAndLossIsReported() throws Exception {
        TumblerLock lock = client.getLock("watched", new LockOptions().ttl(Duration.ofMillis(600)));
        AtomicReference<LockLostException> heard = new AtomicReference<>();
        CountDownLatch lost = new CountDownLatch(1);
        lock.addLostListener(e -> {
            heard.set(e);
            lost.countDown();
        });
        lock.lock();
        long token = lock.fencingToken();
        for (int i = 0; i < 15; i++) {
            Thread.sleep(100);
            assertThrows(BusyException.class, () -> other.acquire("watched", new LockOptions()));
        }
        assertTrue(lock.isHeldByCurrentThread());
        assertEquals(token, client.inspect("watched").holders().get(0).fencingToken(), "extended, never re-acquired");
        // Taken away with its token (an admin): the watchdog's next extend hears NOT_HELD.
        String holder = lock.heldLock().holder();
        assertTrue(other.release("watched", holder, token));
        assertTrue(lost.await(2, TimeUnit.SECONDS));
        assertFalse(lock.isHeldByCurrentThread());
        assertTrue(heard.get().reason().startsWith("not held"), heard.get().reason());
        LockLostException e = assertThrows(LockLostException.class, lock::unlock);
        assertTrue(e.getMessage().contains("lock lost"));
        assertEquals(0, lock.getHoldCount());
    }

    @Test
    void leaseIsCountedFromTheRequestsSendTime() throws Exception {
        long before = System.nanoTime();
        try (HeldLock lock = client.lock("counted", new LockOptions().ttl(Duration.ofSeconds(2)))) {
            long sinceSend = System.nanoTime() - before;
            assertTrue(lock.remaining().toNanos() <= 2_000_000_000L - sinceSend + 1_000_000L,
                    "remaining " + lock.remaining() + " counts from before the request was sent");
        }
        // A holder that already held it: renewed once, counted from that renewal.
        Grant g = client.acquire("counted", new LockOptions().holder("h-1").ttl(Duration.ofSeconds(5)));
        Thread.sleep(300);
        try (HeldLock again = client.lock("counted", new LockOptions().holder("h-1").ttl(Duration.ofSeconds(5)))) {
            assertTrue(again.grant().alreadyHeld());
            assertEquals(g.fencingToken(), again.fencingToken());
            assertTrue(again.grant().expiresAtMs() >= g.expiresAtMs() + 250, "renewed once");
        }
    }

    @Test
    void badInputNamesTheField() {
        InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
                () -> client.acquire("x".repeat(600), new LockOptions()));
        assertEquals("name", e.field(), e.getMessage());
        // Past the request size limit, the body is refused before it is read, naming the limit.
        ResourceExhaustedException big = assertThrows(ResourceExhaustedException.class,
                () -> client.acquire("x".repeat(100_000), new LockOptions()));
        assertTrue(big.getMessage().contains("--max-request-bytes"), big.getMessage());
        e = assertThrows(InvalidArgumentException.class,
                () -> client.acquire("bad-ttl", new LockOptions().ttl(Duration.ZERO)));
        assertEquals("ttl_ms", e.field(), e.getMessage());
        e = assertThrows(InvalidArgumentException.class,
                () -> client.acquire("bad-holder", new LockOptions().holder("h".repeat(5000))));
        assertEquals("holder", e.field(), e.getMessage());
        e = assertThrows(InvalidArgumentException.class,
                () -> client.acquire("bad-kind", new LockOptions().kind("Not A Kind!")));
        assertEquals("kind", e.field(), e.getMessage());
        e = assertThrows(InvalidArgumentException.class,
                () -> client.acquire("bad-md", new LockOptions().metadata("k", "v".repeat(20_000))));
        assertEquals("metadata", e.field(), e.getMessage());
        assertThrows(InvalidArgumentException.class, () -> client.acquireAll(List.of("a", "a"), new LockOptions()));
        assertThrows(FailedPreconditionException.class, () -> {
            client.acquire("rw-mixed", new LockOptions().mode(LockMode.READ));
            client.acquire("rw-mixed", new LockOptions());
        });
    }

    @Test
    void deadlockIsTyped() throws Exception {
        client.acquire("dl-x", new LockOptions().holder("dl-a").ttl(Duration.ofSeconds(20)));
        client.acquire("dl-y", new LockOptions().holder("dl-b").ttl(Duration.ofSeconds(20)));
        Thread t = new Thread(() -> {
            try {
                client.acquire("dl-y", new LockOptions().holder("dl-a").wait(Duration.ofSeconds(10)));
            } catch (TumblerException ignored) {
                // released below
            }
        });
        t.start();
        long until = System.nanoTime() + 5_000_000_000L;
        while (client.queue("dl-y").isEmpty() && System.nanoTime() < until) Thread.sleep(10);
        Thread.sleep(1200);
        DeadlockException e = assertThrows(DeadlockException.class,
                () -> other.acquire("dl-x", new LockOptions().holder("dl-b").wait(Duration.ofSeconds(10))));
        assertTrue(e.getMessage().startsWith("deadlock: "), e.getMessage());
        client.release("dl-y", "dl-b", null);
        client.release("dl-x", "dl-a", null);
        t.join(5000);
        client.release("dl-y", "dl-a", null);
    }

    @Test
    void unavailableAfterRetriesUntilTheDeadline() throws Exception {
        int port = Servers.freePort();
        try (TumblerClient nobody = TumblerClient.builder().endpoint("http://127.0.0.1:" + port)
                .timeout(Duration.ofMillis(700)).build()) {
            long t0 = System.nanoTime();
            UnavailableException e = assertThrows(UnavailableException.class,
                    () -> nobody.acquire("x", new LockOptions()));
            long took = (System.nanoTime() - t0) / 1_000_000;
            assertTrue(e.attempts() > 1, "retried: " + e.attempts());
            assertTrue(took >= 600 && took < 3000, "until its deadline: " + took + " ms");
        }
    }

    /** The same calls through java.net.http.HttpClient (useHttpClient), as https:// always uses it. */
    @Test
    void httpClientTransportToo() throws Exception {
        try (TumblerClient h = TumblerClient.builder().endpoint(endpoint).namespace("java-test").useHttpClient(true)
                .build()) {
            try (HeldLock lock = h.lock("via-httpclient", new LockOptions().ttl(Duration.ofSeconds(5)))) {
                assertThrows(BusyException.class, () -> other.acquire("via-httpclient", new LockOptions()));
                assertTrue(lock.fencingToken() > 0);
            }
            assertEquals("name", assertThrows(InvalidArgumentException.class,
                    () -> h.acquire("x".repeat(600), new LockOptions())).field());
            HeldLock held = other.lock("via-httpclient", new LockOptions().ttl(Duration.ofSeconds(10)));
            AtomicReference<Throwable> thrown = new AtomicReference<>();
            Thread t = new Thread(() -> {
                try {
                    h.lockInterruptibly("via-httpclient", new LockOptions().wait(Duration.ofSeconds(20)));
                } catch (Throwable e) {
                    thrown.set(e);
                }
            });
            t.start();
            long until = System.nanoTime() + 5_000_000_000L;
            while (h.queue("via-httpclient").isEmpty() && System.nanoTime() < until) Thread.sleep(10);
            t.interrupt();
            t.join(2000);
            assertTrue(thrown.get() instanceof InterruptedException, String.valueOf(thrown.get()));
            until = System.nanoTime() + 2_000_000_000L;
            while (!h.queue("via-httpclient").isEmpty() && System.nanoTime() < until) Thread.sleep(10);
            assertTrue(h.queue("via-httpclient").isEmpty(), "the request left the server's queue");
            held.close();
        }
    }

    @Test
    void perCallCostHasNoDelayedAckStall() {
        Duration[] calls = new Duration[200];
        for (int i = 0; i < 100; i++) {
            long t0 = System.nanoTime();
            Grant g = client.acquire("cost", new LockOptions().ttl(Duration.ofSeconds(10)));
            long t1 = System.nanoTime();
            client.release("cost", g.holder(), g.fencingToken());
            long t2 = System.nanoTime();
            calls[2 * i] = Duration.ofNanos(t1 - t0);
            calls[2 * i + 1] = Duration.ofNanos(t2 - t1);
        }
        Arrays.sort(calls);
        assertTrue(calls[100].toMillis() < 10, "median call " + calls[100]);
    }

    @Test
    void semaphoreReadWriteAndMultiLock() throws Exception {
        TumblerSemaphore sem = client.getSemaphore("sem", 3);
        HeldLock two = sem.acquire(2);
        assertEquals(List.of(1, 2), two.slots());
        HeldLock one = sem.tryAcquire().orElseThrow();
        assertTrue(sem.tryAcquire().isEmpty());
        assertEquals(0, sem.availablePermits());
        two.close();
        one.close();
        assertEquals(3, sem.availablePermits());

        TumblerReadWriteLock rw = client.getReadWriteLock("rw");
        rw.writeLock().lock();
        assertThrows(IllegalStateException.class, () -> rw.readLock().lock(), "no self-deadlock");
        HeldLock w = rw.writeLock().heldLock();
        long token = w.fencingToken();
        w.downgrade();
        assertEquals(LockMode.READ, w.mode());
        assertEquals(token, w.fencingToken());
        TumblerLock otherRead = other.getReadWriteLock("rw").readLock();
        assertTrue(otherRead.tryLock(), "a reader joins after the downgrade");
        otherRead.unlock();
        rw.writeLock().unlock();

        TumblerLock both = client.getMultiLock("m-1", "m-2");
        both.lock();
        assertEquals(2, both.heldLock().fencingTokens().size());
        assertFalse(other.getLock("m-2").tryLock());
        both.unlock();
        assertTrue(client.inspect("m-1").holders().isEmpty() && client.inspect("m-2").holders().isEmpty());
    }

    @Test
    void leaderLatchReElectsAfterALostTerm() throws Exception {
        AtomicInteger leads = new AtomicInteger();
        AtomicInteger lost = new AtomicInteger();
        try (LeaderLatch latch = client.leaderLatch("latch", "me")) {
            latch.addListener(new LeaderLatchListener() {
                public void isLeader() { leads.incrementAndGet(); }
                public void notLeader() { lost.incrementAndGet(); }
            });
            latch.start();
            assertTrue(latch.await(5, TimeUnit.SECONDS));
            Leadership first = latch.leadership();
            assertFalse(first.secret().isEmpty(), "the winning campaign's secret");
            // Anyone can read the candidate and term; without the secret, Resign is refused.
            assertThrows(PermissionDeniedException.class,
                    () -> other.resign("latch", first.candidate(), first.term(), ""));
            other.rpc("Clear", Map.of());
            long until = System.nanoTime() + 20_000_000_000L;
            while ((leads.get() < 2 || latch.leadership() == null) && System.nanoTime() < until) Thread.sleep(20);
            assertEquals(1, lost.get());
            assertTrue(latch.leadership().term() > first.term(), "campaigned again: a new term");
        }
        assertEquals(2, lost.get(), "closing the leading latch tells notLeader");
        assertEquals(null, other.leader("latch"));
    }

    @Test
    void taskLockHoldsAtLeastAndAtMost() throws Exception {
        TaskLock a = new TaskLock(client);
        TaskLock b = new TaskLock(other);
        assertThrows(IllegalArgumentException.class,
                () -> a.executeWithLock("t", Duration.ofSeconds(1), Duration.ofSeconds(2), () -> { }));
        AtomicInteger runs = new AtomicInteger();
        assertTrue(a.executeWithLock("t", Duration.ofSeconds(5), Duration.ofMillis(600), runs::incrementAndGet));
        assertFalse(b.executeWithLock("t", Duration.ofSeconds(5), Duration.ZERO, runs::incrementAndGet),
                "held lockAtLeastFor after a short run");
        Thread.sleep(700);
        assertTrue(b.executeWithLock("t", Duration.ofSeconds(5), Duration.ZERO, runs::incrementAndGet));
        assertTrue(client.inspect("t").holders().isEmpty(), "a run past lockAtLeastFor releases at its end");
        assertEquals(2, runs.get());
        // The run sees its fencing token; tokens rise from run to run.
        List<Long> tokens = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            a.execute("t2", Duration.ofSeconds(5), Duration.ZERO, run -> tokens.add(run.fencingToken()));
        }
        assertTrue(tokens.get(1) > tokens.get(0));
        assertEquals(Duration.ofMinutes(10), TaskLock.duration("PT10M", "x"));
        assertEquals(Duration.ofMillis(500), TaskLock.duration("500ms", "x"));
        assertThrows(IllegalArgumentException.class, () -> TaskLock.duration("soon", "lockAtMostFor"));
    }

    /** The same scheduled task in two JVMs: runs never overlap, and start at least lockAtLeastFor apart. */
    @Test
    void taskLockNeverRunsTwiceAtOnceAcrossProcesses() throws Exception {
        Path file = Files.createTempFile(servers.dir, "runs", ".txt");
        List<String> argv = List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                "-XX:TieredStopAtLevel=1", "-cp", where(TaskProcess.class) + java.io.File.pathSeparator
                        + where(TumblerClient.class), TaskProcess.class.getName(),
                endpoint, "java-test", file.toString(), "2500");
        Process p1 = new ProcessBuilder(argv).redirectErrorStream(true).start();
        Process p2 = new ProcessBuilder(argv).redirectErrorStream(true).start();
        String out1 = new String(p1.getInputStream().readAllBytes());
        String out2 = new String(p2.getInputStream().readAllBytes());
        assertEquals(0, p1.waitFor(), out1);
        assertEquals(0, p2.waitFor(), out2);
        List<long[]> runs = new ArrayList<>();
        java.util.Set<String> pids = new java.util.HashSet<>();
        for (String line : Files.readAllLines(file)) {
            String[] f = line.split(" ");
            runs.add(new long[] {Long.parseLong(f[0]), Long.parseLong(f[1])});
            pids.add(f[2]);
        }
        runs.sort((x, y) -> Long.compare(x[0], y[0]));
        assertTrue(runs.size() >= 3, "runs: " + runs.size());
        for (int i = 1; i < runs.size(); i++) {
            assertTrue(runs.get(i)[0] >= runs.get(i - 1)[1], "run " + i + " started before the one before ended");
            assertTrue(runs.get(i)[0] - runs.get(i - 1)[0] >= 290, "run " + i + " within lockAtLeastFor");
        }
        assertTrue(out1.isEmpty() && out2.isEmpty(), out1 + out2);
    }

    private static String where(Class<?> c) throws Exception {
        return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI()).toString();
    }

    /** Bearer tokens over TLS; no token, a wrong one, another namespace, an unverified certificate. */
    @Test
    void tlsWithBearerTokens() throws Exception {
        Path dir = servers.dir;
        String ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
        openssl("req -x509 " + ec + " -keyout " + dir + "/ca.key -out " + dir + "/ca.pem -days 2 -subj /CN=test-ca"
                + " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign");
        Files.writeString(dir.resolve("srv.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                + "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n");
        openssl("req " + ec + " -keyout " + dir + "/srv.key -out " + dir + "/srv.csr -subj /CN=localhost");
        openssl("x509 -req -in " + dir + "/srv.csr -CA " + dir + "/ca.pem -CAkey " + dir + "/ca.key -CAcreateserial"
                + " -out " + dir + "/srv.pem -days 2 -extfile " + dir + "/srv.ext");
        openssl("req -x509 " + ec + " -keyout " + dir + "/other.key -out " + dir + "/other.pem -days 2 -subj /CN=other");
        String out = Servers.run(List.of(Servers.binary(), "token", "--name", "java", "--namespace", "java-tls"));
        String token = null;
        StringBuilder file = new StringBuilder();
        boolean after = false;
        for (String line : out.split("\n")) {
            if (line.contains("not stored anywhere")) after = true;
            else if (after && token == null && line.matches("#\\s+\\S+\\s*")) token = line.replaceAll("[#\\s]", "");
            if (!line.startsWith("#")) file.append(line).append('\n');
        }
        assertNotNull(token, out);
        Files.writeString(dir.resolve("tokens.toml"), file);
        int port = servers.serve("--auth-tokens-file", dir + "/tokens.toml", "--tls-cert-file", dir + "/srv.pem",
                "--tls-key-file", dir + "/srv.key");
        String https = "https://127.0.0.1:" + port;
        try (TumblerClient c = TumblerClient.builder().endpoint(https).caFile(dir.resolve("ca.pem")).token(token)
                .namespace("java-tls").build()) {
            try (HeldLock lock = c.lock("tls", new LockOptions().ttl(Duration.ofSeconds(5)))) {
                assertTrue(lock.fencingToken() > 0);
            }
        }
        for (String[] bad : new String[][] {{null, "java-tls"}, {"tmb_wrong", "java-tls"}, {token, "elsewhere"}}) {
            try (TumblerClient c = TumblerClient.builder().endpoint(https).caFile(dir.resolve("ca.pem")).token(bad[0])
                    .namespace(bad[1]).build()) {
                PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
                        () -> c.acquire("tls", new LockOptions()));
                assertEquals(bad[1].equals("elsewhere") ? "permission_denied" : "unauthenticated", e.code());
            }
        }
        for (Path ca : new Path[] {dir.resolve("other.pem"), null}) {
            try (TumblerClient c = TumblerClient.builder().endpoint(https).caFile(ca).token(token)
                    .namespace("java-tls").timeout(Duration.ofSeconds(3)).build()) {
                long t0 = System.nanoTime();
                assertThrows(TlsException.class, () -> c.acquire("tls", new LockOptions()));
                assertTrue(System.nanoTime() - t0 < 2_000_000_000L, "not retried");
            }
        }
    }

    private static void openssl(String args) throws Exception {
        List<String> argv = new ArrayList<>(List.of("openssl"));
        argv.addAll(Arrays.asList(args.split(" ")));
        Servers.run(argv);
    }
}
