package tumbler.client;

import java.io.BufferedInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.SocketTimeoutException;
import java.nio.channels.ClosedByInterruptException;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.concurrent.ConcurrentLinkedDeque;

/**
 * Connect unary calls over plain HTTP/1.1 with keep-alive, for {@code http://} endpoints: a pool of blocking
 * {@link SocketChannel}s with TCP_NODELAY, each request written in one write (head and body together), answered in
 * the calling thread. Measured here it costs about a tenth of the CPU of {@code java.net.http.HttpClient} per call
 * and a third of its latency (HttpClient hands every exchange between its selector, worker and caller threads).
 *
 * <p>A read waits at most until the call's deadline (SO_TIMEOUT). An interrupt of the calling thread closes the
 * channel (it is an InterruptibleChannel), so the server sees the connection go and drops a waiting request.
 */
final class SocketTransport {
    /** One answer: the HTTP status and the body. */
    static final class Answer {
        final int status;
        final byte[] body;

        Answer(int status, byte[] body) {
            this.status = status;
            this.body = body;
        }
    }

    private static final class Conn {
        final SocketChannel ch;
        final InputStream in;
        final OutputStream out;

        Conn(SocketChannel ch) throws IOException {
            this.ch = ch;
            this.in = new BufferedInputStream(ch.socket().getInputStream(), 8192);
            this.out = ch.socket().getOutputStream();
        }

        void close() {
            try {
                ch.close();
            } catch (IOException ignored) {
                // closing
            }
        }
    }

    private final InetSocketAddress address;
    private final String host;
    private final int connectTimeoutMs;
    private final ConcurrentLinkedDeque<Conn> idle = new ConcurrentLinkedDeque<>();

    SocketTransport(String host, int port, int connectTimeoutMs) {
        this.address = new InetSocketAddress(host, port);
        this.host = host.contains(":") ? "[" + host + "]:" + port : host + ":" + port;
        this.connectTimeoutMs = connectTimeoutMs;
    }

    /**
     * One POST; throws IOException when there was no answer (refused, reset, closed, timed out: the caller retries)
     * and ClosedByInterruptException when the thread was interrupted (the connection is closed).
     */
    Answer post(String path, byte[] body, String authorization, long timeoutMs) throws IOException {
        StringBuilder head = new StringBuilder(256)
                .append("POST ").append(path).append(" HTTP/1.1\r\nHost: ").append(host)
                .append("\r\nContent-Type: application/json\r\nAccept: application/json\r\nConnect-Timeout-Ms: ")
                .append(Math.max(1, timeoutMs)).append("\r\nContent-Length: ").append(body.length).append("\r\n");
        if (authorization != null) head.append("Authorization: ").append(authorization).append("\r\n");
        head.append("\r\n");
        byte[] h = head.toString().getBytes(StandardCharsets.UTF_8);
        byte[] request = Arrays.copyOf(h, h.length + body.length);
        System.arraycopy(body, 0, request, h.length, body.length);
        // A kept-alive connection the server closed meanwhile fails at once: the request is sent again on a new
        // one (the server never read it). Any other failure is the caller's to retry.
        while (true) {
            Conn c = idle.pollFirst();
            boolean reused = c != null;
            if (c == null) c = open(timeoutMs);
            try {
                c.ch.socket().setSoTimeout((int) Math.max(1, Math.min(Integer.MAX_VALUE, timeoutMs)));
                c.out.write(request);
                c.out.flush();
                Answer a = read(c);
                return a;
            } catch (ClosedByInterruptException e) {
                c.close();
                throw e;
            } catch (SocketTimeoutException e) {
                c.close();
                throw e;
            } catch (IOException e) {
                c.close();
                if (!reused || Thread.currentThread().isInterrupted()) throw e;
            }
        }
    }

    private Conn open(long timeoutMs) throws IOException {
        SocketChannel ch = SocketChannel.open();
        try {
            ch.socket().setTcpNoDelay(true);
            ch.socket().connect(address, (int) Math.max(1, Math.min(connectTimeoutMs, timeoutMs)));
            return new Conn(ch);
        } catch (IOException e) {
            ch.close();
            throw e;
        }
    }

    private Answer read(Conn c) throws IOException {
        String status = line(c.in);
        if (!status.startsWith("HTTP/1.") || status.length() < 12) throw new IOException("not HTTP: " + status);
        int code = Integer.parseInt(status.substring(9, 12));
        int length = -1;
        boolean chunked = false;
        boolean close = status.startsWith("HTTP/1.0");
        String l;
        while (!(l = line(c.in)).isEmpty()) {
            int colon = l.indexOf(':');
            if (colon < 0) continue;
            String name = l.substring(0, colon).trim();
            String value = l.substring(colon + 1).trim();
            if (name.equalsIgnoreCase("content-length")) length = Integer.parseInt(value);
            else if (name.equalsIgnoreCase("transfer-encoding")) chunked = value.toLowerCase().contains("chunked");
            else if (name.equalsIgnoreCase("connection")) close = value.equalsIgnoreCase("close");
        }
        byte[] body;
        if (chunked) {
            java.io.ByteArrayOutputStream buf = new java.io.ByteArrayOutputStream();
            while (true) {
                String size = line(c.in);
                int semi = size.indexOf(';');
                int n = Integer.parseInt((semi < 0 ? size : size.substring(0, semi)).trim(), 16);
                if (n == 0) {
                    while (!line(c.in).isEmpty()) {
                        // trailers
                    }
                    break;
                }
                buf.write(exactly(c.in, n));
                line(c.in);
            }
            body = buf.toByteArray();
        } else if (length >= 0) {
            body = exactly(c.in, length);
        } else {
            body = c.in.readAllBytes();
            close = true;
        }
        if (close) c.close();
        else idle.offerFirst(c);
        return new Answer(code, body);
    }

    private static byte[] exactly(InputStream in, int n) throws IOException {
        byte[] b = in.readNBytes(n);
        if (b.length < n) throw new EOFException("the answer ended early");
        return b;
    }

    private static String line(InputStream in) throws IOException {
        StringBuilder sb = new StringBuilder(64);
        int ch;
        while ((ch = in.read()) != '\n') {
            if (ch < 0) throw new EOFException("the connection closed");
            if (ch != '\r') sb.append((char) ch);
        }
        return sb.toString();
    }

    /** Closes the idle connections. */
    void close() {
        Conn c;
        while ((c = idle.pollFirst()) != null) c.close();
    }
}
