// java Pairs TARGET ADDR CALLERS PAIRS SECS
//
// The Java arms of bench/clients/run.sh: acquire+release pairs, try-once, each caller on its own lock name.
// TARGET `tumbler` (tumbler.client.TumblerClient: Connect JSON over java.net.http.HttpClient, HTTP/1.1 kept alive;
// callers are threads sharing one client) or `redis` (the plain Redis lock: SET key token NX PX ttl, then
// compare-and-delete by EVALSHA, through a small RESP client over a socket, one connection per caller thread, as a
// Jedis pool hands them out; Debian packages no Java Redis client). A JVM compiles its hot code as it runs, so each
// caller first warms up: 20 pairs, then until WARM_SECS (default 3) have passed since the start, before the measured
// run of up to PAIRS pairs in all, cut at SECS seconds. Prints "pairs=N secs=S"; a pair not granted and released
// fails the run. JAVA_HTTPCLIENT=1: the client's calls through java.net.http.HttpClient instead of its own
// HTTP/1.1 connections (for the comparison in clients/java/README.md).

import java.io.BufferedInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import tumbler.client.Grant;
import tumbler.client.LockOptions;
import tumbler.client.TumblerClient;

public final class Pairs {
    static final long TTL_MS = 10_000;
    static final String UNLOCK = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";

    interface Pair {
        void run(String name) throws Exception;
    }

    public static void main(String[] a) throws Exception {
        String target = a[0];
        String addr = a[1];
        int callers = Integer.parseInt(a[2]);
        long pairs = Long.parseLong(a[3]);
        double secs = Double.parseDouble(a[4]);
        double warmSecs = Double.parseDouble(System.getenv().getOrDefault("WARM_SECS", "3"));
        long t0 = System.nanoTime();
        TumblerClient client = target.equals("tumbler")
                ? TumblerClient.builder().endpoint("http://" + addr)
                        .useHttpClient(System.getenv("JAVA_HTTPCLIENT") != null).build() : null;
        CyclicBarrier ready = new CyclicBarrier(callers + 1);
        CyclicBarrier go = new CyclicBarrier(callers + 1);
        AtomicLong done = new AtomicLong();
        AtomicReference<Throwable> failed = new AtomicReference<>();
        long[] deadline = new long[1];
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < callers; i++) {
            final int me = i;
            final long share = pairs / callers + (i < pairs % callers ? 1 : 0);
            Thread t = new Thread(() -> {
                try {
                    Pair pair = target.equals("tumbler") ? tumbler(client) : redis(addr);
                    String name = "bench-java-" + ProcessHandle.current().pid() + "-" + me;
                    for (int k = 0; k < 20 || System.nanoTime() - t0 < warmSecs * 1e9; k++) pair.run(name);
                    ready.await();
                    go.await();
                    long n = 0;
                    while (n < share && System.nanoTime() < deadline[0]) {
                        pair.run(name);
                        n++;
                    }
                    done.addAndGet(n);
                } catch (Throwable e) {
                    failed.compareAndSet(null, e);
                    ready.reset();
                    go.reset();
                }
            });
            t.start();
            threads.add(t);
        }
        ready.await();
        long start = System.nanoTime();
        deadline[0] = start + (long) (secs * 1e9);
        go.await();
        for (Thread t : threads) t.join();
        double elapsed = (System.nanoTime() - start) / 1e9;
        if (failed.get() != null) {
            System.err.println("java " + target + ": " + failed.get());
            System.exit(1);
        }
        System.out.printf("pairs=%d secs=%.6f%n", done.get(), elapsed);
        System.exit(0);
    }

    static Pair tumbler(TumblerClient client) {
        LockOptions options = new LockOptions().ttl(Duration.ofMillis(TTL_MS));
        return name -> {
            Grant g = client.acquire(name, options.copy());
            if (!client.release(name, g.holder(), g.fencingToken())) throw new IllegalStateException(name + ": not held");
        };
    }

    static Pair redis(String addr) throws IOException {
        Resp r = new Resp(addr);
        String sha = r.call("SCRIPT", "LOAD", UNLOCK).toString();
        return name -> {
            String token = Long.toHexString(ThreadLocalRandom.current().nextLong())
                    + Long.toHexString(ThreadLocalRandom.current().nextLong());
            Object ok = r.call("SET", name, token, "NX", "PX", Long.toString(TTL_MS));
            if (!"OK".equals(ok)) throw new IllegalStateException("SET " + name + ": not acquired");
            if (!Long.valueOf(1).equals(r.call("EVALSHA", sha, "1", name, token))) {
                throw new IllegalStateException("unlock " + name + ": not held");
            }
        };
    }

    /** The least RESP client: one connection, commands as bulk strings, replies read as they come. */
    static final class Resp {
        final Socket socket = new Socket();
        final OutputStream out;
        final InputStream in;

        Resp(String addr) throws IOException {
            int colon = addr.lastIndexOf(':');
            socket.setTcpNoDelay(true);
            socket.connect(new InetSocketAddress(addr.substring(0, colon), Integer.parseInt(addr.substring(colon + 1))));
            out = socket.getOutputStream();
            in = new BufferedInputStream(socket.getInputStream());
        }

        Object call(String... args) throws IOException {
            StringBuilder sb = new StringBuilder("*").append(args.length).append("\r\n");
            for (String s : args) {
                byte[] b = s.getBytes(StandardCharsets.UTF_8);
                sb.append('$').append(b.length).append("\r\n").append(s).append("\r\n");
            }
            out.write(sb.toString().getBytes(StandardCharsets.UTF_8));
            out.flush();
            return read();
        }

        Object read() throws IOException {
            int type = in.read();
            String line = line();
            switch (type) {
                case '+': return line;
                case '-': throw new IOException("redis: " + line);
                case ':': return Long.parseLong(line);
                case '$': {
                    int n = Integer.parseInt(line);
                    if (n < 0) return null;
                    byte[] b = in.readNBytes(n + 2);
                    return new String(b, 0, n, StandardCharsets.UTF_8);
                }
                default: throw new IOException("redis: unexpected reply type " + (char) type);
            }
        }

        String line() throws IOException {
            StringBuilder sb = new StringBuilder();
            int c;
            while ((c = in.read()) != '\r') {
                if (c < 0) throw new IOException("redis: connection closed");
                sb.append((char) c);
            }
            in.read();
            return sb.toString();
        }
    }

    private Pairs() {}
}
