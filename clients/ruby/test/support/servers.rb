# frozen_string_literal: true

# Real servers for the Ruby tests: redis-server and `tumbler serve` on free
# loopback ports (never 6379), started and stopped by pid. Logs go to
# $TUMBLER_TEST_LOGS (default: a new temporary directory), named in failures.
require 'fileutils'
require 'socket'
require 'tmpdir'

module TumblerTest
  ROOT = File.expand_path('../../../..', __dir__)
  LOGS = ENV['TUMBLER_TEST_LOGS'] || Dir.mktmpdir('tumbler-ruby-tests')
  FileUtils.mkdir_p(LOGS)

  module_function

  def mono = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Waits until the block is truthy; returns its value, or raises after the deadline.
  def wait_until(what, timeout: 10, every: 0.02)
    deadline = mono + timeout
    loop do
      value = yield
      return value if value
      raise "timed out after #{timeout} s waiting for #{what}" if mono > deadline

      sleep every
    end
  end

  def free_port
    s = TCPServer.new('127.0.0.1', 0)
    s.addr[1]
  ensure
    s&.close
  end

  def listening?(port)
    TCPSocket.new('127.0.0.1', port).close
    true
  rescue SystemCallError
    false
  end

  def log_path(name) = File.join(LOGS, "#{name}.log")

  def spawn_logged(name, env, *argv)
    log = log_path(name)
    pid = Process.spawn(env, *argv, out: log, err: log, in: File::NULL)
    [pid, log]
  end

  def wait_listening(pid, port, what, log, timeout: 30)
    wait_until("#{what} on 127.0.0.1:#{port} (log: #{log})", timeout: timeout) do
      raise "#{what} exited (log: #{log})" if Process.waitpid(pid, Process::WNOHANG)

      listening?(port)
    end
  end

  def start_redis
    port = free_port
    pid, log = spawn_logged("redis-#{port}", {}, 'redis-server', '--port', port.to_s, '--bind', '127.0.0.1',
                            '--save', '', '--appendonly', 'no')
    wait_listening(pid, port, 'redis-server', log)
    [pid, port]
  end

  def tumbler_bin = ENV['TUMBLER_BIN'] || File.join(ROOT, 'target', 'debug', 'tumbler')

  # `tumbler serve` against the given Redis; http_port: nil for none.
  def start_tumbler(redis_port, port: free_port, http_port: nil, flags: [])
    http = http_port ? "127.0.0.1:#{http_port}" : 'off'
    pid, log = spawn_logged("tumbler-#{port}-#{Time.now.to_i}", {}, tumbler_bin, 'serve', '--listen', "127.0.0.1:#{port}",
                            '--http-listen', http, '--no-auth', '--shutdown-drain-ms', '0',
                            '--redis-url', "redis://127.0.0.1:#{redis_port}", *flags)
    wait_listening(pid, port, 'tumbler serve', log)
    [pid, port]
  end

  # A redis-server and `tumbler serve` over it for one test file, both
  # stopped after the run: [the server's address, the Redis port].
  def start_servers
    redis_pid, redis_port = start_redis
    pid, port = start_tumbler(redis_port)
    Minitest.after_run do
      stop(pid)
      stop(redis_pid)
    end
    ["127.0.0.1:#{port}", redis_port]
  end

  # Stops a process this suite started, by its pid.
  def stop(pid, signal = 'TERM', timeout: 15)
    return unless pid

    Process.kill(signal, pid)
    deadline = mono + timeout
    until Process.waitpid(pid, Process::WNOHANG)
      if mono > deadline
        Process.kill('KILL', pid)
        Process.waitpid(pid)
        break
      end
      sleep 0.02
    end
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end
end
