package tumbler.client;

import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * Marks a no-argument method as a scheduled task that runs in one process at a time, as ShedLock's
 * {@code @SchedulerLock}: {@link TaskLock#guarded(Object, String)} reads it. Durations are ISO-8601 ({@code PT10M})
 * or a number with a unit ({@code 500ms}, {@code 30s}, {@code 10m}, {@code 1h}).
 */
@Retention(RetentionPolicy.RUNTIME)
@Target(ElementType.METHOD)
public @interface SchedulerLock {
    /** The lock's name: the same in every process that runs the task. */
    String name();

    /** The longest the lock is held, also when the process dies mid-run: longer than the task ever runs. */
    String lockAtMostFor();

    /** The shortest the lock is held from the start, so that processes whose clocks differ do not run it twice. */
    String lockAtLeastFor() default "0s";
}
