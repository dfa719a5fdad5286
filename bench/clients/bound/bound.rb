# ruby bound.rb MODE ADDR PAIRS
#
# The floor under the Ruby client (issue 50 item 4): what one call costs
# through Ruby's own transport libraries doing nothing else, against the
# same server the client bench uses. One caller, sequential calls, a
# warm-up of 200, then PAIRS of them. Prints "MODE: N µs per call". MODE:
#
#   grpc-health     the grpc gem: an empty unary Health/Check (no Redis behind it)
#   grpc-pairs      the grpc gem: Acquire + Release by the generated stub,
#                   requests built once, no deadline, no metadata
#   nethttp-pairs   Net::HTTP, one kept-alive HTTP/1.1 connection, Connect
#                   binary proto (application/proto), requests built once
#   connect-pairs   a bare TCPSocket (TCP_NODELAY, one write per request),
#                   Connect binary proto, requests serialized once, answers parsed
#
# A "call" is one acquire or one release (half a pair), as in run.sh; the
# CPU is this process's user + system time per call.
# Needs the tumbler-client gem installed (for its generated messages).
require 'socket'
require 'tumbler'

mode, addr, n = ARGV[0], ARGV[1], Integer(ARGV[2])
host, port = addr.split(':')
V1 = Tumbler::V1
acq = V1::AcquireRequest.new(name: "bound-rb-#{mode}", holder: 'bound-rb', ttl_ms: 10_000)
rel = V1::ReleaseRequest.new(name: acq.name, holder: 'bound-rb')

# Seconds for `count` runs of the block after a warm-up; $cpu: the process's
# CPU seconds (user + system) in them.
def timed(count, &one)
  200.times(&one)
  c0 = Process.times
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  count.times(&one)
  secs = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
  c1 = Process.times
  $cpu = (c1.utime - c0.utime) + (c1.stime - c0.stime)
  secs
end

case mode
when 'grpc-health'
  require 'grpc/health/v1/health_services_pb'
  stub = Grpc::Health::V1::Health::Stub.new(addr, :this_channel_is_insecure)
  req = Grpc::Health::V1::HealthCheckRequest.new
  secs = timed(n) { stub.check(req) }
  calls = n
when 'grpc-pairs'
  stub = V1::LockService::Stub.new(addr, :this_channel_is_insecure)
  secs = timed(n) do
    stub.acquire(acq)
    stub.release(rel)
  end
  calls = 2 * n
when 'nethttp-pairs'
  require 'net/http'
  http = Net::HTTP.new(host, Integer(port))
  http.start
  headers = { 'Content-Type' => 'application/proto' }
  a_body = V1::AcquireRequest.encode(acq)
  r_body = V1::ReleaseRequest.encode(rel)
  secs = timed(n) do
    V1::AcquireResponse.decode(http.post('/tumbler.v1.LockService/Acquire', a_body, headers).body)
    V1::ReleaseResponse.decode(http.post('/tumbler.v1.LockService/Release', r_body, headers).body)
  end
  calls = 2 * n
when 'connect-pairs'
  sock = TCPSocket.new(host, Integer(port))
  sock.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
  request = lambda do |method, body|
    "POST /tumbler.v1.LockService/#{method} HTTP/1.1\r\nHost: #{addr}\r\nContent-Type: application/proto\r\n" \
      "Content-Length: #{body.bytesize}\r\n\r\n".b + body
  end
  a_req = request.call('Acquire', V1::AcquireRequest.encode(acq))
  r_req = request.call('Release', V1::ReleaseRequest.encode(rel))
  buf = +''.b
  call = lambda do |req, cls|
    sock.write(req)
    loop do
      if (head_end = buf.index("\r\n\r\n"))
        length = buf[0, head_end][/^content-length:\s*(\d+)/i, 1].to_i
        if buf.bytesize >= head_end + 4 + length
          body = buf.byteslice(head_end + 4, length)
          buf = buf.byteslice(head_end + 4 + length..)
          return cls.decode(body)
        end
      end
      buf << sock.readpartial(65_536)
    end
  end
  secs = timed(n) do
    call.call(a_req, V1::AcquireResponse)
    call.call(r_req, V1::ReleaseResponse)
  end
  calls = 2 * n
else
  abort "unknown mode #{mode}"
end
puts format('%s: %.0f µs per call, %.0f µs CPU per call', mode, secs / calls * 1e6, $cpu / calls * 1e6)
