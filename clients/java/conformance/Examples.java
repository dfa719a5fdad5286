// Java seed patterns of clients/java/README.md, run by the conformance driver: Redisson's RLock through
// java.util.concurrent.locks.Lock, ShedLock's @SchedulerLock on a ScheduledExecutorService (TaskLock), Curator's
// LeaderLatch, a semaphore of weighted permits, a ReadWriteLock, and a multi-lock.
//
// usage: java -cp tumbler-client.jar:tumbler-conformance.jar Examples ADDR NAMESPACE all

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.Lock;
import java.util.concurrent.locks.ReadWriteLock;
import tumbler.client.HeldLock;
import tumbler.client.InvalidArgumentException;
import tumbler.client.LeaderLatch;
import tumbler.client.LeaderLatchListener;
import tumbler.client.LockLostException;
import tumbler.client.LockOptions;
import tumbler.client.SchedulerLock;
import tumbler.client.TaskLock;
import tumbler.client.TumblerClient;
import tumbler.client.TumblerLock;
import tumbler.client.TumblerSemaphore;

public final class Examples {
    static final List<Object> checks = new ArrayList<>();

    static void check(String what, boolean ok, Object detail) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("what", what);
        m.put("ok", ok);
        if (detail != null) m.put("detail", String.valueOf(detail));
        checks.add(m);
    }

    static TumblerClient client(String addr, String ns) {
        return TumblerClient.builder().endpoint("http://" + addr).namespace(ns).timeout(Duration.ofSeconds(5)).build();
    }

    /** A nightly report, as a bean whose method carries ShedLock's annotation. */
    public static final class Reports {
        final List<long[]> runs = Collections.synchronizedList(new ArrayList<>());
        final AtomicInteger running = new AtomicInteger();
        final AtomicBoolean overlapped = new AtomicBoolean();

        @SchedulerLock(name = "java-nightly-report", lockAtMostFor = "10s", lockAtLeastFor = "700ms")
        public void nightly() throws InterruptedException {
            if (running.incrementAndGet() > 1) overlapped.set(true);
            long start = System.nanoTime();
            Thread.sleep(100);
            runs.add(new long[] {start, System.nanoTime()});
            running.decrementAndGet();
        }
    }

    public static void main(String[] argv) throws Exception {
        String addr = argv[0];
        String ns = argv[1];
        try (TumblerClient a = client(addr, ns); TumblerClient b = client(addr, ns)) {
            lockInterface(a, b);
            scheduled(a, b);
            scheduledAtMost(a, b);
            latch(a, b);
            semaphore(a);
            readWrite(a, b);
            multi(a, b);
        }
        StringBuilder sb = new StringBuilder("{\"checks\":[");
        for (int i = 0; i < checks.size(); i++) {
            @SuppressWarnings("unchecked")
            Map<String, Object> m = (Map<String, Object>) checks.get(i);
            if (i > 0) sb.append(',');
            sb.append("{\"what\":").append(quote((String) m.get("what"))).append(",\"ok\":").append(m.get("ok"));
            if (m.containsKey("detail")) sb.append(",\"detail\":").append(quote((String) m.get("detail")));
            sb.append('}');
        }
        System.out.println(sb.append("]}"));
        System.exit(0);
    }

    static String quote(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') sb.append('\\').append(ch);
            else if (ch < 0x20) sb.append(String.format("\\u%04x", (int) ch));
            else sb.append(ch);
        }
        return sb.append('"').toString();
    }

    /** Redisson's RLock, as a java.util.concurrent.locks.Lock shared by two processes (two clients). */
    static void lockInterface(TumblerClient a, TumblerClient b) throws Exception {
        Lock mine = a.getLock("java-rlock");
        TumblerLock theirs = b.getLock("java-rlock");
        mine.lock();
        mine.lock(); // reentrant, as RLock
        long first = ((TumblerLock) mine).fencingToken();
        boolean[] other = new boolean[1];
        Thread t = new Thread(() -> other[0] = theirs.tryLock());
        t.start();
        t.join();
        check("Lock: another process's tryLock() is false while it is held (reentrant: hold count "
                + ((TumblerLock) mine).getHoldCount() + ")", !other[0] && ((TumblerLock) mine).getHoldCount() == 2, null);
        mine.unlock();
        check("Lock: still held after one of two unlocks", ((TumblerLock) mine).isHeldByCurrentThread(), null);
        mine.unlock();
        boolean got = theirs.tryLock(2, TimeUnit.SECONDS);
        long second = theirs.fencingToken();
        theirs.unlock();
        check("Lock: tryLock(2, SECONDS) gets it after the last unlock, with a higher fencing token",
                got && second > first, first + " then " + second);
        boolean refused = false;
        try {
            theirs.unlock();
        } catch (IllegalMonitorStateException e) {
            refused = true;
        }
        check("Lock: unlock() by a thread that does not hold it throws IllegalMonitorStateException", refused, null);
    }

    /** ShedLock: the same task scheduled in two processes every 100 ms runs in one at a time, lockAtLeastFor apart. */
    static void scheduled(TumblerClient a, TumblerClient b) throws Exception {
        Reports report = new Reports();
        AtomicInteger errors = new AtomicInteger();
        List<ScheduledExecutorService> schedulers = new ArrayList<>();
        for (TumblerClient c : List.of(a, b)) {
            ScheduledExecutorService s = Executors.newSingleThreadScheduledExecutor();
            TaskLock tasks = new TaskLock(c).onError(e -> errors.incrementAndGet());
            s.scheduleAtFixedRate(tasks.guarded(report, "nightly"), 0, 100, TimeUnit.MILLISECONDS);
            schedulers.add(s);
        }
        Thread.sleep(2500);
        for (ScheduledExecutorService s : schedulers) {
            s.shutdown();
            s.awaitTermination(5, TimeUnit.SECONDS);
        }
        List<long[]> runs = new ArrayList<>(report.runs);
        runs.sort((x, y) -> Long.compare(x[0], y[0]));
        long minGap = Long.MAX_VALUE;
        for (int i = 1; i < runs.size(); i++) minGap = Math.min(minGap, (runs.get(i)[0] - runs.get(i - 1)[0]) / 1_000_000);
        check("@SchedulerLock: fired 50 times in two processes over 2.5 s, ran " + runs.size() + " times, never two at "
                + "once, starts at least lockAtLeastFor (700 ms) apart (min " + minGap + " ms)",
                !report.overlapped.get() && runs.size() >= 3 && runs.size() <= 4 && minGap >= 690 && errors.get() == 0,
                "errors " + errors.get());
    }

    /** lockAtMostFor: a run past its lease is interrupted and reported lost; another process may run then. */
    static void scheduledAtMost(TumblerClient a, TumblerClient b) throws Exception {
        TaskLock tasks = new TaskLock(a);
        boolean[] interrupted = {false};
        String raised = "none";
        long start = System.nanoTime();
        try {
            tasks.executeWithLock("java-stuck-task", Duration.ofMillis(800), Duration.ZERO, () -> {
                try {
                    Thread.sleep(5000);
                } catch (InterruptedException e) {
                    interrupted[0] = true;
                }
            });
        } catch (LockLostException e) {
            raised = e.getClass().getSimpleName();
        }
        long took = (System.nanoTime() - start) / 1_000_000;
        // The run counted its lease from before its send, so it stops a little before Redis lets the lease go: the
        // other process tries for up to a second (a try-once run each time, as a scheduler firing again would).
        TaskLock other = new TaskLock(b);
        boolean otherRan = false;
        long until = System.nanoTime() + 1_000_000_000L;
        while (!otherRan && System.nanoTime() < until) {
            otherRan = other.executeWithLock("java-stuck-task", Duration.ofSeconds(5), Duration.ZERO, () -> { });
            if (!otherRan) Thread.sleep(20);
        }
        check("lockAtMostFor 800 ms: a 5 s run interrupted after " + took + " ms, LockLostException; another process "
                + "runs the task within a second",
                interrupted[0] && raised.equals("LockLostException") && took < 2000 && otherRan, raised);
    }

    /** Curator's LeaderLatch: one of two leads; when it closes, the other is elected. */
    static void latch(TumblerClient a, TumblerClient b) throws Exception {
        CountDownLatch bLeads = new CountDownLatch(1);
        AtomicInteger aLost = new AtomicInteger();
        try (LeaderLatch la = a.leaderLatch("java-scheduler", "10.0.0.7:8080");
             LeaderLatch lb = b.leaderLatch("java-scheduler", "10.0.0.8:8080")) {
            la.addListener(new LeaderLatchListener() {
                public void isLeader() { }
                public void notLeader() { aLost.incrementAndGet(); }
            });
            la.start();
            boolean aFirst = la.await(5, TimeUnit.SECONDS);
            lb.addListener(new LeaderLatchListener() {
                public void isLeader() { bLeads.countDown(); }
                public void notLeader() { }
            });
            lb.start();
            Thread.sleep(300);
            check("LeaderLatch: the first latch leads (term " + (aFirst ? la.leadership().term() : 0)
                    + "), the second waits", aFirst && !lb.hasLeadership()
                    && "10.0.0.7:8080".equals(a.leader("java-scheduler").value()), null);
            long term = la.leadership().term();
            la.leadership().proclaim("10.0.0.7:9090");
            check("LeaderLatch: leader() shows the proclaimed value",
                    "10.0.0.7:9090".equals(b.leader("java-scheduler").value()), null);
            la.close();
            boolean elected = bLeads.await(5, TimeUnit.SECONDS);
            check("LeaderLatch: closing the leader resigns; the second is elected with a higher term, listeners told",
                    elected && lb.hasLeadership() && lb.leadership().term() > term && aLost.get() == 1,
                    "notLeader calls " + aLost.get());
        }
    }

    /** A semaphore of 10 permits: a big job takes 3, small ones the rest; 11 of 10 is refused naming permits. */
    static void semaphore(TumblerClient a) {
        TumblerSemaphore exports = a.getSemaphore("java-exports", 10);
        try (HeldLock big = exports.acquire(3)) {
            check("semaphore: a big job holds 3 of 10 permits, slots " + big.slots(),
                    big.permits() == 3 && big.slots().equals(List.of(1, 2, 3)), null);
            List<HeldLock> small = new ArrayList<>();
            for (int i = 0; i < 7; i++) small.add(exports.tryAcquire().orElseThrow());
            check("semaphore: seven small jobs take the other slots; none left",
                    exports.availablePermits() == 0 && exports.tryAcquire().isEmpty(), null);
            small.forEach(HeldLock::close);
            String refused = "";
            try {
                exports.tryAcquire(11);
            } catch (InvalidArgumentException e) {
                refused = e.getMessage();
            }
            check("semaphore: 11 of 10 throws InvalidArgumentException naming permits", refused.startsWith("permits"),
                    refused);
        }
    }

    /** A ReadWriteLock: readers in two processes at once; a writer refused while they read, granted after. */
    static void readWrite(TumblerClient a, TumblerClient b) throws Exception {
        ReadWriteLock ra = a.getReadWriteLock("java-catalog");
        ReadWriteLock rb = b.getReadWriteLock("java-catalog");
        ra.readLock().lock();
        boolean[] seen = new boolean[2];
        CountDownLatch reading = new CountDownLatch(1);
        CountDownLatch done = new CountDownLatch(1);
        Thread reader = new Thread(() -> {
            seen[0] = rb.readLock().tryLock();
            reading.countDown();
            try {
                done.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            if (seen[0]) rb.readLock().unlock();
        });
        reader.start();
        reading.await();
        Thread writer = new Thread(() -> {
            try {
                seen[1] = ra.writeLock().tryLock(200, TimeUnit.MILLISECONDS);
                if (seen[1]) ra.writeLock().unlock();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        writer.start();
        writer.join();
        ra.readLock().unlock();
        done.countDown();
        reader.join();
        boolean granted = rb.writeLock().tryLock(2, TimeUnit.SECONDS);
        if (granted) rb.writeLock().unlock();
        check("ReadWriteLock: two readers at once (two processes), a writer refused while they read, granted after",
                seen[0] && !seen[1] && granted, null);
    }

    /** A multi-lock: both accounts or none. */
    static void multi(TumblerClient a, TumblerClient b) throws Exception {
        TumblerLock transfer = a.getMultiLock("java-account-1", "java-account-2");
        transfer.lock();
        Optional<Boolean> other = Optional.of(b.getLock("java-account-2").tryLock());
        List<Long> tokens = transfer.heldLock().fencingTokens();
        transfer.unlock();
        check("multi-lock: both accounts held together (tokens " + tokens + "), one of them refused to another",
                tokens.size() == 2 && !other.get(), null);
    }

    private Examples() {}
}
