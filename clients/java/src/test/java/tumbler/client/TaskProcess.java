package tumbler.client;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.time.Duration;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;

/**
 * One process of the cross-process task test: schedules the guarded task every 50 ms for a while; each run
 * appends "start end" (wall clock, ms) to a file shared with the other process.
 * usage: TaskProcess ENDPOINT NAMESPACE FILE MILLIS
 */
public final class TaskProcess {
    public static void main(String[] a) throws Exception {
        Path out = Path.of(a[2]);
        try (TumblerClient client = TumblerClient.builder().endpoint(a[0]).namespace(a[1]).build()) {
            TaskLock tasks = new TaskLock(client).onError(e -> System.err.println("task error: " + e));
            ScheduledExecutorService s = Executors.newSingleThreadScheduledExecutor();
            s.scheduleAtFixedRate(tasks.guarded("cross-process", Duration.ofSeconds(10), Duration.ofMillis(300), () -> {
                long start = System.currentTimeMillis();
                try {
                    Thread.sleep(120);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
                try {
                    Files.writeString(out, start + " " + System.currentTimeMillis() + " " + ProcessHandle.current().pid()
                            + "\n", StandardOpenOption.CREATE, StandardOpenOption.APPEND);
                } catch (IOException e) {
                    throw new IllegalStateException(e);
                }
            }), 0, 50, TimeUnit.MILLISECONDS);
            Thread.sleep(Long.parseLong(a[3]));
            s.shutdown();
            s.awaitTermination(5, TimeUnit.SECONDS);
        }
    }

    private TaskProcess() {}
}
