# frozen_string_literal: true

# The Connect transport of the unary calls: binary protobuf
# (application/proto) POSTed over kept-alive HTTP/1.1 connections to the
# server's gRPC port, which serves Connect beside gRPC (docs/api.md,
# "Connect and gRPC-Web on the gRPC port"). The server turns each request
# into the gRPC call it stands for: auth, validation, deadlines and errors
# are the same.
#
# Tumbler::ConnectStub has the generated stub's unary methods
# (stub.acquire(request, deadline:, metadata:)) and raises GRPC::BadStatus
# (GRPC::Unavailable, GRPC::InvalidArgument, ...) as the grpc gem does, so
# Client#call retries and maps errors the same over both transports.
#
# Why: one unary call through the grpc gem costs this process a few
# hundred microseconds of its own; one request written to a socket and
# one answer read from it cost a few tens (README.md, "What a call costs").
#
# A connection is one caller's at a time (a pool: a thread takes an idle
# one or opens one, and puts it back after a whole answer). A request is
# one write with TCP_NODELAY, so no call waits on a delayed ACK.
# Connect-Timeout-Ms carries the deadline to the server, which answers
# before it; reads wait no longer than the deadline either. A call cut by
# its deadline or by an exception raised into its thread (Timeout.timeout,
# LockLost) closes its connection, never reuses it: closing is how the
# server learns the caller is gone (a waiting Acquire leaves the queue). A
# reused connection the server had closed while idle is replaced and the
# request sent once more, only when nothing of an answer came back.
require 'io/wait'
require 'json'
require 'openssl'
require 'socket'

module Tumbler
  class ConnectStub
    SERVICE = 'tumbler.v1.LockService'
    # Connect's error codes (the JSON body's "code") -> gRPC status codes.
    CODES = GRPC::Core::StatusCodes.constants.to_h { |c| [c.to_s.downcase, GRPC::Core::StatusCodes.const_get(c)] }
                                   .merge('canceled' => GRPC::Core::StatusCodes::CANCELLED).freeze
    # What an HTTP status means when the body names no code (Connect's table, read backwards).
    HTTP_CODES = { 400 => :INTERNAL, 401 => :UNAUTHENTICATED, 403 => :PERMISSION_DENIED, 404 => :UNIMPLEMENTED,
                   429 => :UNAVAILABLE, 502 => :UNAVAILABLE, 503 => :UNAVAILABLE, 504 => :UNAVAILABLE }
                 .transform_values { |c| GRPC::Core::StatusCodes.const_get(c) }.freeze
    # [method name, stub method, response class] of every unary RPC of the service.
    UNARY = V1::LockService::Service.rpc_descs.filter_map do |name, desc|
      next if desc.input.is_a?(GRPC::RpcDesc::Stream) || desc.output.is_a?(GRPC::RpcDesc::Stream)

      [name.to_s, GRPC::GenericService.underscore(name.to_s).to_sym, desc.output]
    end.freeze

    # A reused connection gave no answer at all: send again on a fresh one.
    class Reused < StandardError; end

    # "host:port" or "[v6]:port" -> [host, port]; nil for targets only gRPC resolves (dns:///, unix:).
    def self.split_target(target)
      m = target.to_s.match(/\A(?:\[([^\]]+)\]|([^:\/\[\]]+)):(\d+)\z/)
      m && [m[1] || m[2], Integer(m[3])]
    end

    # One HTTP/1.1 connection and what was read past the last answer.
    #
    # The hot path is lean on purpose (README.md, "What a call costs"): the
    # request leaves by write_nonblock (no GVL hand-off, no second write);
    # a plaintext socket waits for its answer before reading (ppoll, then
    # one read: an answer never arrives within the write's own syscall);
    # reads go into one reused buffer; the head is parsed by index on one
    # lowercased copy (status line, content-length, transfer-encoding,
    # connection), not split into lines.
    class Conn
      READ_SIZE = 16_384
      HEAD_END = "\r\n\r\n"
      CRLF = "\r\n"

      # A connection given back this recently (s) is taken again without
      # the peek (#stale?): a server that closed it meanwhile is met as a
      # reused connection that gave no answer (Reused), and the request goes
      # again on a fresh one, as when the close comes just after a peek.
      FRESH = 1.0

      attr_reader :io
      # When it was last given back (Client.now).
      attr_accessor :idle_since

      def initialize(io)
        @io = io
        @plain = io.is_a?(BasicSocket) # TLS: the SSLSocket may hold decrypted bytes the socket no longer shows
        @buf = String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
        @chunk = String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
        @used = false
        @idle_since = -Float::INFINITY
      end

      def close
        @io.close
      rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
        nil
      end

      # Given back within FRESH with nothing left over: taken again without a peek.
      def fresh? = @buf.empty? && Client.now - @idle_since < FRESH

      # An idle connection with something to read: the server closed it (or sent junk).
      def stale?
        return true unless @buf.empty?
        # A peek that finds nothing is the live idle connection; "" is the server's FIN.
        return @io.recv_nonblock(1, Socket::MSG_PEEK, @chunk, exception: false) != :wait_readable if @plain

        !IO.select([@io.to_io], nil, nil, 0).nil?
      rescue IOError, SystemCallError
        true
      end

      # Sends one request, reads its whole answer: [status, body, keep-alive].
      # Reused: a connection that served before gave no answer at all (the
      # server closed it while idle), so the request may go again on a fresh one.
      #
      # The common case goes straight (a plaintext socket with nothing left
      # over: one write, one wait, one read); an answer in pieces, and TLS,
      # the way #exchange goes.
      def roundtrip(request, deadline)
        if @plain && @buf.empty?
          reused = @used
          begin
            n = @io.write_nonblock(request, exception: false)
            if n == request.bytesize
              wait(:wait_readable, deadline)
              data = @io.read_nonblock(READ_SIZE, @chunk, exception: false)
              raise EOFError, 'the server closed the connection' if data.nil?

              @buf << data if data.is_a?(String)
            else
              send_all(n.is_a?(Integer) ? request.byteslice(n, request.bytesize - n) : request, deadline)
            end
            head_end = read_until(HEAD_END, deadline, true)
          rescue EOFError, SystemCallError => e
            raise Reused, e.message if reused && @buf.empty?

            raise
          end
          status, body, keep = read_answer(head_end, deadline)
          @used = true
          return [status, body, keep]
        end

        answer = nil
        keep = exchange(request, 1, deadline) { |status, body| answer = [status, body] }
        [answer[0], answer[1], keep]
      end

      # Sends `request` (one request, or `count` of them back to back: HTTP/1.1
      # pipelining) in one write and reads `count` answers in order, yielding
      # each one's status and body. Returns whether the connection can serve
      # again: false when an answer closed it, which ends the exchange there.
      # Reused as for #roundtrip, only while no answer of this exchange came.
      def exchange(request, count, deadline)
        reused = @used
        begin
          send_all(request, deadline)
          head_end = read_until(HEAD_END, deadline, true)
        rescue EOFError, SystemCallError => e
          raise Reused, e.message if reused && @buf.empty?

          raise
        end
        answered = 0
        loop do
          status, body, keep = read_answer(head_end, deadline)
          @used = true
          answered += 1
          yield status, body
          return keep if answered == count || !keep

          head_end = read_until(HEAD_END, deadline, true)
        end
      end

      private

      # The rest of an answer whose head ends at head_end: [status, body, keep-alive].
      def read_answer(head_end, deadline)
        status, length, chunked, keep = parse_head(head_end)
        from = head_end + 4
        body = if !chunked && length && @buf.bytesize == from + length
                 # The common case: exactly one answer was read; nothing is left over.
                 out = @buf.byteslice(from, length)
                 @buf.clear
                 out
               else
                 consume(from)
                 if chunked
                   read_chunked(deadline)
                 elsif length
                   take(length, deadline)
                 else
                   keep = false
                   read_to_end(deadline)
                 end
               end
        [status, body, keep]
      end

      def send_all(data, deadline)
        loop do
          n = @io.write_nonblock(data, exception: false)
          if n.is_a?(Integer)
            return if n == data.bytesize

            data = data.byteslice(n, data.bytesize - n)
          else
            wait(n, deadline)
          end
        end
      end

      # "HTTP/1.x NNN ...", then the headers that say where the body ends and
      # whether the connection stays open: [status, length, chunked, keep].
      def parse_head(head_end)
        raise ArgumentError, 'not an HTTP/1 answer' unless @buf.start_with?('HTTP/1.') && @buf.getbyte(8) == 32

        status = Integer(@buf.byteslice(9, 3), 10)
        keep = @buf.getbyte(7) == 49 # HTTP/1.1 keeps the connection unless told otherwise
        head = @buf.byteslice(0, head_end + 2)
        head.downcase!
        length = nil
        chunked = false
        if (v = header(head, "\r\ncontent-length:"))
          length = Integer(v, 10)
          raise ArgumentError, "content-length: #{v}" if length.negative?
        end
        chunked = v.include?('chunked') if (v = header(head, "\r\ntransfer-encoding:"))
        if (v = header(head, "\r\nconnection:"))
          keep = keep ? !v.include?('close') : v.include?('keep-alive')
        end
        [status, length, chunked, keep]
      end

      # The value of the first header named so (its "\r\nname:"), stripped; nil when absent.
      def header(head, name)
        i = head.index(name)
        return nil unless i

        from = i + name.bytesize
        head.byteslice(from, head.index(CRLF, from) - from).strip
      end

      def read_chunked(deadline)
        body = +''.b
        loop do
          i = read_until(CRLF, deadline)
          size = @buf.byteslice(0, i).split(';').first.to_i(16)
          consume(i + 2)
          if size.zero?
            consume(read_until(CRLF, deadline) + 2)
            return body
          end
          body << take(size, deadline)
          take(2, deadline)
        end
      end

      def read_to_end(deadline)
        loop { fill(deadline) }
      rescue EOFError
        out = @buf.dup
        @buf.clear
        out
      end

      def consume(n)
        if n >= @buf.bytesize
          @buf.clear
        else
          @buf = @buf.byteslice(n, @buf.bytesize - n)
        end
      end

      def take(n, deadline)
        fill(deadline) while @buf.bytesize < n
        out = @buf.byteslice(0, n)
        consume(n)
        out
      end

      # The index of marker in what was read, reading until it comes.
      # awaiting: nothing of this answer was read yet, so a plaintext socket
      # waits before its first read (it would only find EAGAIN).
      def read_until(marker, deadline, awaiting = false)
        from = 0
        loop do
          unless @buf.empty?
            i = @buf.index(marker, from)
            return i if i

            from = [@buf.bytesize - marker.bytesize + 1, 0].max
          end
          fill(deadline, awaiting && @buf.empty?)
        end
      end

      def fill(deadline, wait_first = false)
        wait(:wait_readable, deadline) if wait_first && @plain
        loop do
          data = @io.read_nonblock(READ_SIZE, @chunk, exception: false)
          case data
          when :wait_readable, :wait_writable then wait(data, deadline)
          when nil then raise EOFError, 'the server closed the connection'
          else
            @buf << data
            return
          end
        end
      end

      # Waits until the socket is readable (or writable), at most until the deadline.
      def wait(what, deadline)
        left = nil
        if deadline
          left = deadline - Client.now
          raise DeadlineExceeded if left <= 0
        end
        ready = what == :wait_readable ? @io.to_io.wait_readable(left) : @io.to_io.wait_writable(left)
        raise DeadlineExceeded unless ready
      end
    end

    class DeadlineExceeded < StandardError; end

    attr_reader :authority

    # ssl_context: an OpenSSL::SSL::SSLContext for TLS (nil: plaintext);
    # server_hostname: the name the certificate is checked against (default: host).
    def initialize(host, port, ssl_context: nil, server_hostname: nil)
      @host = host
      @port = port
      @ssl = ssl_context
      @server_hostname = server_hostname || host
      @authority = host.include?(':') ? "[#{host}]:#{port}" : "#{host}:#{port}"
      @prefix = UNARY.to_h do |name, _, _|
        [name, "POST /#{SERVICE}/#{name} HTTP/1.1\r\nHost: #{@authority}\r\nContent-Type: application/proto\r\n" \
               "Connect-Protocol-Version: 1\r\n".b.freeze]
      end
      @idle = []
      @pid = Process.pid
      @mutex = Mutex.new
      @closed = false
      @methods = UNARY.to_h { |name, method, response| [method, [name, response]] }
      UNARY.each do |name, method, response|
        define_singleton_method(method) do |request, deadline: nil, metadata: {}, **_ignored|
          unary(name, response, request, deadline && (Client.now + (deadline.to_f - Time.now.to_f)), metadata)
        end
      end
    end

    # The unary RPC `method` (:acquire, ...) with a monotonic deadline (Client.now's clock; nil: none).
    def invoke(method, request, deadline, metadata)
      name, response = @methods.fetch(method)
      unary(name, response, request, deadline, metadata)
    end

    # (Client#release_many sent its releases so before LockService.Batch;
    # it now sends one Batch request, which costs the server less:
    # clients/ruby-sidekiq/bench/bulk.rb compares the two.)
    #
    # Several requests of the unary RPC `method` at once, pipelined: written
    # back to back in one write on one connection, their answers read in
    # order (the server answers a connection's requests one after another).
    # Returns, in the order of `requests`, each one's response or the
    # GRPC::BadStatus it was answered with. Those left without an answer
    # (the connection ended, or the deadline passed, before it came) are
    # UNAVAILABLE or DEADLINE_EXCEEDED and may or may not have been applied:
    # pipeline only what is safe to send again (a release pinned to its
    # fencing token). Nothing here is retried but what #invoke retries: a
    # reused connection that gave no answer at all is replaced and
    # everything sent once more.
    def pipeline(method, requests, deadline, metadata)
      return [] if requests.empty?

      name, response = @methods.fetch(method)
      bytes = requests.map { |r| request_bytes(name, r.class.encode(r), deadline, metadata) }.join
      results = []
      2.times do
        conn = take(deadline)
        keep = false
        failure = nil
        begin
          keep = conn.exchange(bytes, requests.size, deadline) do |status, answer|
            results << (status == 200 ? response.decode(answer) : error_from_answer(status, answer))
          end
        rescue Reused
          next
        rescue DeadlineExceeded
          failure = GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::DEADLINE_EXCEEDED, 'Deadline Exceeded')
        rescue IOError, SystemCallError, OpenSSL::SSL::SSLError, ArgumentError => e
          failure = GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::UNAVAILABLE, "#{@authority}: #{e.message}")
        ensure
          # An exchange cut short leaves answers unread: the connection is closed, not reused.
          conn.close unless keep && results.size == requests.size
        end
        give_back(conn) if keep && results.size == requests.size
        failure ||= GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::UNAVAILABLE,
                                                         "#{@authority}: the connection was closed before this answer")
        results << failure while results.size < requests.size
        return results
      end
      Array.new(requests.size) do
        GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::UNAVAILABLE, "#{@authority}: the connection was closed")
      end
    end

    def close
      idle = @mutex.synchronize do
        @closed = true
        @idle.dup.tap { @idle.clear }
      end
      idle.each(&:close)
    end

    private

    def unary(name, response, request, deadline, metadata)
      body = request.class.encode(request)
      2.times do
        conn = take(deadline)
        answered = false
        begin
          status, answer, keep = conn.roundtrip(request_bytes(name, body, deadline, metadata), deadline)
          answered = true
        rescue Reused
          next
        rescue DeadlineExceeded
          raise GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::DEADLINE_EXCEEDED, 'Deadline Exceeded')
        rescue IOError, SystemCallError, OpenSSL::SSL::SSLError, ArgumentError => e
          raise GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::UNAVAILABLE, "#{@authority}: #{e.message}")
        ensure
          # Anything else that ends the call unanswered (an error, LockLost raised into the thread,
          # Timeout.timeout, which throws in Ruby 3.1) closes the connection: its answer is unread.
          conn.close unless answered
        end
        keep ? give_back(conn) : conn.close
        return response.decode(answer) if status == 200

        raise error_from_answer(status, answer)
      end
      raise GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::UNAVAILABLE,
                                                 "#{@authority}: the connection was closed")
    end

    # The whole request, head and body, as one binary string (one write),
    # made by one interpolation (fewer steps than appending piece by piece;
    # binary, as its head and body are).
    def request_bytes(name, body, deadline, metadata)
      head = @prefix[name]
      unless metadata.nil? || metadata.empty?
        head = head.dup
        metadata.each { |k, v| head << "#{k}: #{v}\r\n".b }
      end
      return "#{head}Content-Length: #{body.bytesize}\r\n\r\n#{body}" unless deadline

      ms = ((deadline - Client.now) * 1000).ceil
      ms = 1 if ms < 1
      ms = 9_999_999_999 if ms > 9_999_999_999
      "#{head}Content-Length: #{body.bytesize}\r\nConnect-Timeout-Ms: #{ms}\r\n\r\n#{body}"
    end

    def take(deadline)
      loop do
        conn = @mutex.synchronize do
          # A forked child: the idle connections are the parent's; leave them to it.
          (@idle = []) && (@pid = Process.pid) unless @pid == Process.pid
          @idle.pop
        end
        break unless conn
        return conn if conn.fresh? || !conn.stale?

        conn.close
      end
      open(deadline)
    rescue DeadlineExceeded, Errno::ETIMEDOUT
      raise GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::DEADLINE_EXCEEDED, 'connecting: timed out')
    rescue SystemCallError, SocketError, IOError, OpenSSL::SSL::SSLError => e
      raise GRPC::BadStatus.new_status_exception(GRPC::Core::StatusCodes::UNAVAILABLE,
                                                 "connecting to #{@authority}: #{e.message}")
    end

    def open(deadline)
      left = deadline && [deadline - Client.now, 0.001].max
      sock = Socket.tcp(@host, @port, connect_timeout: left)
      sock.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
      return conn = Conn.new(sock) unless @ssl

      tls = OpenSSL::SSL::SSLSocket.new(sock, @ssl)
      tls.sync_close = true
      tls.hostname = @server_hostname
      begin
        tls.connect_nonblock
      rescue IO::WaitReadable, IO::WaitWritable => e
        left = deadline && (deadline - Client.now)
        raise DeadlineExceeded if left && left <= 0

        ready = e.is_a?(IO::WaitReadable) ? IO.select([sock], nil, nil, left) : IO.select(nil, [sock], nil, left)
        raise DeadlineExceeded unless ready

        retry
      end
      tls.post_connection_check(@server_hostname) if @ssl.verify_mode != OpenSSL::SSL::VERIFY_NONE
      conn = Conn.new(tls)
    ensure
      sock&.close unless conn
    end

    def give_back(conn)
      conn.idle_since = Client.now
      closed = @mutex.synchronize do
        @idle.push(conn) unless @closed
        @closed
      end
      conn.close if closed
    end

    def error_from_answer(status, body)
      err = begin
        JSON.parse(body)
      rescue JSON::ParserError
        nil
      end
      code = err.is_a?(Hash) ? CODES[err['code']] : nil
      message = err.is_a?(Hash) ? err['message'].to_s : body.to_s.byteslice(0, 200).dup.force_encoding(Encoding::UTF_8).scrub
      code ||= HTTP_CODES.fetch(status, GRPC::Core::StatusCodes::UNKNOWN)
      message = "HTTP #{status}" if message.empty?
      GRPC::BadStatus.new_status_exception(code, message)
    end
  end
end
