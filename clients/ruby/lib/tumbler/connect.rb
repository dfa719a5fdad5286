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
    class Conn
      attr_reader :io

      def initialize(io)
        @io = io
        @buf = +''.b
        @used = false
      end

      def close
        @io.close
      rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
        nil
      end

      # An idle connection with something to read: the server closed it (or sent junk).
      def stale?
        return true unless @buf.empty?

        !IO.select([@io.to_io], nil, nil, 0).nil?
      rescue IOError, SystemCallError
        true
      end

      # Sends one request, reads its whole answer: [status, body, keep-alive].
      def roundtrip(request, deadline)
        @io.write(request)
        begin
          head_end = read_until("\r\n\r\n", deadline)
        rescue EOFError, SystemCallError => e
          raise Reused, e.message if @used && @buf.empty?

          raise
        end
        status, length, chunked, keep = parse_head(@buf.byteslice(0, head_end))
        consume(head_end + 4)
        body = if chunked
                 read_chunked(deadline)
               elsif length
                 take(length, deadline)
               else
                 keep = false
                 read_to_end(deadline)
               end
        @used = true
        [status, body, keep]
      end

      private

      def parse_head(head)
        lines = head.split("\r\n")
        version, status = lines.first.split(' ', 3)
        length = nil
        chunked = false
        keep = version == 'HTTP/1.1'
        lines.drop(1).each do |line|
          name, value = line.split(':', 2)
          case name.strip.downcase
          when 'content-length' then length = Integer(value.strip)
          when 'transfer-encoding' then chunked = value.downcase.include?('chunked')
          when 'connection' then keep = keep ? value.strip.casecmp('close') != 0 : value.strip.casecmp('keep-alive').zero?
          end
        end
        [Integer(status), length, chunked, keep]
      end

      def read_chunked(deadline)
        body = +''.b
        loop do
          i = read_until("\r\n", deadline)
          size = @buf.byteslice(0, i).split(';').first.to_i(16)
          consume(i + 2)
          if size.zero?
            consume(read_until("\r\n", deadline) + 2)
            return body
          end
          body << take(size, deadline)
          take(2, deadline)
        end
      end

      def read_to_end(deadline)
        loop { fill(deadline) }
      rescue EOFError
        out = @buf
        @buf = +''.b
        out
      end

      def consume(n)
        @buf = @buf.byteslice(n, @buf.bytesize - n) || +''.b
      end

      def take(n, deadline)
        fill(deadline) while @buf.bytesize < n
        out = @buf.byteslice(0, n)
        consume(n)
        out
      end

      def read_until(marker, deadline)
        from = 0
        loop do
          i = @buf.index(marker, from)
          return i if i

          from = [@buf.bytesize - marker.bytesize + 1, 0].max
          fill(deadline)
        end
      end

      def fill(deadline)
        loop do
          data = @io.read_nonblock(65_536, exception: false)
          case data
          when :wait_readable, :wait_writable
            left = deadline && (deadline - Client.now)
            raise DeadlineExceeded if left && left <= 0

            ready = data == :wait_readable ? @io.to_io.wait_readable(left) : @io.to_io.wait_writable(left)
            raise DeadlineExceeded unless ready
          when nil then raise EOFError, 'the server closed the connection'
          else
            @buf << data
            return
          end
        end
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
               "Connect-Protocol-Version: 1\r\n"]
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

    def request_bytes(name, body, deadline, metadata)
      head = +"#{@prefix[name]}Content-Length: #{body.bytesize}\r\n"
      if deadline
        head << "Connect-Timeout-Ms: #{((deadline - Client.now) * 1000).ceil.clamp(1, 9_999_999_999)}\r\n"
      end
      metadata&.each { |k, v| head << "#{k}: #{v}\r\n" }
      head << "\r\n"
      head.b << body
    end

    def take(deadline)
      loop do
        conn = @mutex.synchronize do
          # A forked child: the idle connections are the parent's; leave them to it.
          (@idle = []) && (@pid = Process.pid) unless @pid == Process.pid
          @idle.pop
        end
        break unless conn
        return conn unless conn.stale?

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
