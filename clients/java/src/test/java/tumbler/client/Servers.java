package tumbler.client;

import java.io.File;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * Real servers for the tests: a redis-server and {@code tumbler serve} on free loopback ports (never 6379), stopped
 * by their own process handles (never by name). The binary is $TUMBLER_BIN, else ../../target/debug/tumbler, else
 * ../../target/release/tumbler.
 */
final class Servers implements AutoCloseable {
    private final List<Process> procs = new ArrayList<>();
    final Path dir;
    final int redisPort;

    Servers() throws IOException, InterruptedException {
        dir = Files.createTempDirectory("tumbler-java-test");
        redisPort = freePort();
        start("redis", List.of("redis-server", "--port", Integer.toString(redisPort), "--bind", "127.0.0.1", "--save",
                "", "--appendonly", "no"), redisPort);
    }

    static String binary() {
        String bin = System.getenv("TUMBLER_BIN");
        if (bin != null && !bin.isEmpty()) return bin;
        for (String p : new String[] {"../../target/debug/tumbler", "../../target/release/tumbler"}) {
            File f = new File(p);
            if (f.canExecute()) return f.getAbsolutePath();
        }
        throw new IllegalStateException("no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)");
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket()) {
            s.bind(new InetSocketAddress("127.0.0.1", 0));
            return s.getLocalPort();
        }
    }

    /** {@code tumbler serve} on a free port over this Redis, with extra flags; returns its port. */
    int serve(String... flags) throws IOException, InterruptedException {
        int port = freePort();
        List<String> argv = new ArrayList<>(List.of(binary(), "serve", "--listen", "127.0.0.1:" + port,
                "--http-listen", "off", "--redis-url", "redis://127.0.0.1:" + redisPort, "--log-level", "warn"));
        argv.addAll(Arrays.asList(flags));
        start("serve-" + port, argv, port);
        return port;
    }

    Process start(String name, List<String> argv, int port) throws IOException, InterruptedException {
        File log = dir.resolve(name + ".log").toFile();
        Process p = new ProcessBuilder(argv).redirectErrorStream(true).redirectOutput(log).start();
        procs.add(p);
        long until = System.nanoTime() + 30_000_000_000L;
        while (System.nanoTime() < until) {
            if (!p.isAlive()) throw new IllegalStateException(name + " exited: " + Files.readString(log.toPath()));
            try (Socket s = new Socket()) {
                s.connect(new InetSocketAddress("127.0.0.1", port), 200);
                return p;
            } catch (IOException e) {
                Thread.sleep(50);
            }
        }
        throw new IllegalStateException(name + " did not listen on " + port + ": " + Files.readString(log.toPath()));
    }

    /** Runs a command to its end; its output. */
    static String run(List<String> argv) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(argv).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) throw new IllegalStateException(argv + ": " + out);
        return out;
    }

    void stop(Process p) throws InterruptedException {
        p.destroy();
        if (!p.waitFor(10, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            p.waitFor();
        }
    }

    @Override
    public void close() throws InterruptedException {
        for (int i = procs.size() - 1; i >= 0; i--) stop(procs.get(i));
    }
}
