package tumbler.client;

import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.time.Duration;
import java.util.Locale;
import java.util.concurrent.Callable;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * Runs a scheduled task in one process at a time, as ShedLock's {@code LockingTaskExecutor} and
 * {@code @SchedulerLock(name, lockAtMostFor, lockAtLeastFor)}: a run starts only if the named lock is free (it
 * tries once, never waits: a process that finds it held skips this run), holds it at least {@code lockAtLeastFor}
 * from the start and at most {@code lockAtMostFor}.
 *
 * <ul>
 * <li><b>At most.</b> The lease is {@code lockAtMostFor} and nothing extends it, so a process that dies mid-run
 * frees the task at that time. A run still going when its lease ends has its thread interrupted and its run counted
 * as lost (the lease is counted from the request's send time, so this happens no later than the server's lease
 * ends): another process may start the task from then on. A task that ignores interrupts can outlive its lease, as
 * with ShedLock; hand {@link Run#fencingToken()} to what it writes, which can then refuse the older run.</li>
 * <li><b>At least.</b> A run that ends sooner leaves the lock held until {@code lockAtLeastFor} after the grant (an
 * extend pinned to its token), so a process whose schedule fires a little later does not run it again.</li>
 * <li><b>Never twice at once.</b> Across processes by the lock; within one process, a run that finds the lock held
 * by its own earlier run skips, as any other.</li>
 * </ul>
 *
 * <pre>{@code
 * TaskLock tasks = new TaskLock(client);
 * scheduler.scheduleAtFixedRate(tasks.guarded("nightly-report", Duration.ofMinutes(10), Duration.ofSeconds(30),
 *         () -> report.run()), 0, 1, TimeUnit.MINUTES);
 * }</pre>
 */
public final class TaskLock {
    private final TumblerClient client;
    private volatile Consumer<Throwable> onError = e -> System.err.println("tumbler task: " + e);

    public TaskLock(TumblerClient client) {
        this.client = client;
    }

    /** Where {@link #guarded} Runnables report a task's exception or a lost run (default: standard error). */
    public TaskLock onError(Consumer<Throwable> onError) {
        this.onError = onError;
        return this;
    }

    /** One run of a guarded task, as its body sees it. */
    public static final class Run {
        private final HeldLock held;
        private final long started;

        Run(HeldLock held, long started) {
            this.held = held;
            this.started = started;
        }

        /** The run's fencing token: strictly greater than any earlier run's. */
        public long fencingToken() { return held.fencingToken(); }
        /** False once the lease (lockAtMostFor) ran out: stop. */
        public boolean isHeld() { return held.isHeld(); }
        public HeldLock heldLock() { return held; }
        public Duration elapsed() { return Duration.ofNanos(System.nanoTime() - started); }
    }

    /** What a body that needs its run (its fencing token) implements. */
    @FunctionalInterface
    public interface Task<T> {
        T run(Run run) throws Exception;
    }

    /**
     * Runs {@code task} if the lock {@code name} is free: true when it ran, false when another run holds the lock.
     * The task's exception is thrown (after the lock is handled as for a run that ended); a run whose lease ended
     * under it throws {@link LockLostException} once it returns.
     */
    public boolean executeWithLock(String name, Duration lockAtMostFor, Duration lockAtLeastFor, Runnable task) {
        return run(name, lockAtMostFor, lockAtLeastFor, run -> {
            task.run();
            return null;
        }, new Object[1]);
    }

    /**
     * As {@link #executeWithLock(String, Duration, Duration, Runnable)} for a body that takes its {@link Run} (its
     * fencing token) and returns a value: empty when skipped (or when the body returned null).
     */
    @SuppressWarnings("unchecked")
    public <T> java.util.Optional<T> execute(String name, Duration lockAtMostFor, Duration lockAtLeastFor,
                                             Task<T> task) {
        Object[] out = new Object[1];
        run(name, lockAtMostFor, lockAtLeastFor, task, out);
        return java.util.Optional.ofNullable((T) out[0]);
    }

    private boolean run(String name, Duration lockAtMostFor, Duration lockAtLeastFor, Task<?> task, Object[] out) {
        if (lockAtLeastFor == null) lockAtLeastFor = Duration.ZERO;
        if (lockAtMostFor == null || lockAtMostFor.isZero() || lockAtMostFor.isNegative()) {
            throw new IllegalArgumentException("lockAtMostFor: must be positive");
        }
        if (lockAtLeastFor.compareTo(lockAtMostFor) > 0) {
            throw new IllegalArgumentException("lockAtLeastFor: " + lockAtLeastFor + " is longer than lockAtMostFor "
                    + lockAtMostFor);
        }
        long start = System.nanoTime();
        HeldLock held;
        try {
            held = client.lock(name, new LockOptions().ttl(lockAtMostFor).wait(Duration.ZERO).kind("scheduled"));
        } catch (NotAcquiredException e) {
            return false;
        }
        long granted = System.nanoTime(); // the server's grant is no later than this
        held.watchdog(false);
        Thread worker = Thread.currentThread();
        ScheduledFuture<?> stop = client.timer.schedule(() -> {
            if (held.isLost()) worker.interrupt();
        }, Math.max(0, held.remaining().toNanos()), TimeUnit.NANOSECONDS);
        Run run = new Run(held, start);
        Throwable failure = null;
        try {
            out[0] = task.run(run);
        } catch (Throwable t) {
            failure = t;
        } finally {
            stop.cancel(false);
        }
        boolean lost = held.isLost();
        if (lost) Thread.interrupted(); // the interrupt was for the run, not for its caller
        if (!lost) {
            long heldMs = (System.nanoTime() - granted) / 1_000_000;
            long left = lockAtLeastFor.toMillis() - heldMs;
            try {
                if (left > 0) {
                    held.extend(Duration.ofMillis(left)); // kept until lockAtLeastFor after the grant, then it ends
                    held.watchdog(false);
                } else {
                    held.release();
                }
            } catch (TumblerException e) {
                if (failure == null) failure = e;
            }
        }
        if (failure instanceof RuntimeException) throw (RuntimeException) failure;
        if (failure instanceof Error) throw (Error) failure;
        if (failure != null) throw new IllegalStateException(name + ": the task failed", failure);
        if (lost) throw held.lostException();
        return true;
    }

    /**
     * A Runnable for a {@link java.util.concurrent.ScheduledExecutorService}: each time it fires, runs the task if
     * the lock is free. It never throws (an exception would stop the schedule): failures go to {@link #onError}.
     */
    public Runnable guarded(String name, Duration lockAtMostFor, Duration lockAtLeastFor, Runnable task) {
        return () -> {
            try {
                executeWithLock(name, lockAtMostFor, lockAtLeastFor, task);
            } catch (Throwable t) {
                onError.accept(t);
            }
        };
    }

    /** A Runnable of {@code target}'s no-argument method {@code method}, guarded as its {@link SchedulerLock} says. */
    public Runnable guarded(Object target, String method) {
        Method m;
        try {
            m = target.getClass().getMethod(method);
        } catch (NoSuchMethodException e) {
            throw new IllegalArgumentException(method + ": no public no-argument method of " + target.getClass());
        }
        SchedulerLock a = m.getAnnotation(SchedulerLock.class);
        if (a == null) throw new IllegalArgumentException(method + ": not annotated @SchedulerLock");
        Duration atMost = duration(a.lockAtMostFor(), "lockAtMostFor");
        Duration atLeast = duration(a.lockAtLeastFor(), "lockAtLeastFor");
        return guarded(a.name(), atMost, atLeast, () -> {
            try {
                m.invoke(target);
            } catch (InvocationTargetException e) {
                Throwable c = e.getCause();
                if (c instanceof RuntimeException) throw (RuntimeException) c;
                throw new IllegalStateException(a.name() + ": the task failed", c);
            } catch (IllegalAccessException e) {
                throw new IllegalStateException(e);
            }
        });
    }

    private static final Pattern SIMPLE = Pattern.compile("(\\d+)\\s*(ms|s|m|h|d)");

    /** ISO-8601 ({@code PT10M}) or a number with a unit ({@code 500ms}, {@code 30s}, {@code 10m}, {@code 1h}, {@code 1d}). */
    static Duration duration(String s, String field) {
        String t = s.trim();
        Matcher m = SIMPLE.matcher(t.toLowerCase(Locale.ROOT));
        if (m.matches()) {
            long n = Long.parseLong(m.group(1));
            switch (m.group(2)) {
                case "ms": return Duration.ofMillis(n);
                case "s": return Duration.ofSeconds(n);
                case "m": return Duration.ofMinutes(n);
                case "h": return Duration.ofHours(n);
                default: return Duration.ofDays(n);
            }
        }
        try {
            return Duration.parse(t);
        } catch (RuntimeException e) {
            throw new IllegalArgumentException(field + ": '" + s + "' is not a duration (PT10M, 30s, 500ms)");
        }
    }
}
