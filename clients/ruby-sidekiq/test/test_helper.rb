# frozen_string_literal: true

# Starts the suite's real servers (a redis-server for tumbler and for
# Sidekiq's queues, database 1; a `tumbler serve`) before the test app is
# loaded, and gives the tests real Sidekiq processes (`sidekiq -r
# test/app.rb`, Sidekiq's own executable) to start, kill and restart.
require 'minitest/autorun'
require 'json'
require 'logger'
require 'securerandom'
require 'stringio'
require_relative '../../ruby/test/support/servers'

module SidekiqHarness
  APP = File.expand_path('app.rb', __dir__)
  NAMESPACE = 'sidekiq-test'

  class << self
    attr_reader :redis_port, :tumbler_port, :http_port

    def start
      @redis_pid, @redis_port = TumblerTest.start_redis
      @http_port = TumblerTest.free_port
      @tumbler_pid, @tumbler_port = TumblerTest.start_tumbler(@redis_port, http_port: @http_port)
      ENV['REDIS_URL'] = "redis://127.0.0.1:#{@redis_port}/1"
      ENV['TUMBLER_ADDR'] = "127.0.0.1:#{@tumbler_port}"
      ENV['TUMBLER_NAMESPACE'] = NAMESPACE
      Minitest.after_run { stop }
    end

    def stop
      SidekiqProcess.all.each(&:stop)
      TumblerTest.stop(@tumbler_pid)
      TumblerTest.stop(@redis_pid)
    end
  end

  # One `sidekiq -r test/app.rb` process, stopped by its pid.
  class SidekiqProcess
    @all = []
    class << self
      attr_reader :all
    end

    attr_reader :pid, :log, :queue

    def initialize(queue:, concurrency: 5, timeout: 1, env: {}, app: APP)
      @queue = queue
      @argv = [RbConfig.ruby, Gem.bin_path('sidekiq', 'sidekiq'), '-r', app, '-q', queue,
               '-c', concurrency.to_s, '-t', timeout.to_s]
      @env = env
      @starts = 0
      @nth = self.class.all.any? { |p| p.queue == queue } ? "-#{SecureRandom.hex(2)}" : '' # a second Sidekiq on the queue: a log of its own
      self.class.all << self
    end

    def start
      @starts += 1
      @pid, @log = TumblerTest.spawn_logged("sidekiq-#{@queue}-#{@starts}#{@nth}", @env, *@argv)
      self
    end

    def running? = @pid && !@exited

    def log_text = File.read(@log)

    # SIGKILL: no shutdown, no requeue, no lock released.
    def kill
      Process.kill('KILL', @pid)
      Process.waitpid(@pid)
      @exited = true
    end

    # SIGTERM: Sidekiq's own shutdown (waits -t seconds for jobs, then
    # pushes those still running back to their queues). Returns the exit status.
    def terminate(timeout: 20)
      Process.kill('TERM', @pid)
      TumblerTest.wait_until("sidekiq #{@pid} to exit after SIGTERM (log: #{@log})", timeout: timeout) do
        Process.waitpid(@pid, Process::WNOHANG)
      end
      @exited = true
    end

    def stop
      return unless @pid && !@exited

      TumblerTest.stop(@pid, 'TERM', timeout: 10)
      @exited = true
    end

    def restart
      @exited = false
      start
    end
  end
end

SidekiqHarness.start
require_relative 'app'
Sidekiq.logger.level = Logger::WARN

# What the tests share: the jobs' reports, gates, tumbler's view of a lock.
module SidekiqTestHelpers
  def redis = (@redis ||= Redis.new(url: ENV.fetch('REDIS_URL')))
  def tumbler = Tumbler::Sidekiq.client
  def wait_until(what, timeout: 15, &cond) = TumblerTest.wait_until(what, timeout: timeout, &cond)

  def new_tag(prefix) = "#{prefix}-#{SecureRandom.hex(3)}"

  def events(tag) = redis.lrange("ev:#{tag}", 0, -1).map { |l| JSON.parse(l) }
  def starts(tag) = events(tag).select { |e| e['e'] == 'start' }
  def ends(tag) = events(tag).select { |e| %w[end fail].include?(e['e']) }
  def max_running(tag) = starts(tag).map { |e| e['running'] }.max.to_i

  def open_gate(tag, tokens = 1) = tokens.times { redis.rpush("gate:#{tag}", 'go') }

  def sidekiq(queue, **opts)
    SidekiqHarness::SidekiqProcess.new(queue: queue, **opts).start
  end

  # The lock's name for a job (its digest), as the middleware computes it.
  def digest_for(klass, queue, args, extra = {})
    item = { 'class' => klass.name, 'queue' => queue, 'args' => args }.merge(extra)
    Tumbler::Sidekiq::LockOptions.for(klass, item).digest(item)
  end

  def holders(name) = tumbler.inspect_lock(name).holders.map(&:grant)
  # The job id a grant's holder belongs to ("<jid>" queued, "<jid>:<run id>" running).
  def job_of(holder) = Tumbler::Sidekiq::JobLock.job_of(holder)
  # [job id, holder, fencing token] of each grant on the lock.
  def held_by(name) = holders(name).map { |g| [job_of(g.holder), g.holder, g.fencing_token.to_s] }
  def waiters(name) = tumbler.queue(name).waiters

  def queue_jids(queue) = Sidekiq::Queue.new(queue).map(&:jid)
  def set_jids(set) = set.map(&:jid)

  # Captures the client-side log lines of the middleware (this process).
  def capture_log
    io = StringIO.new
    Tumbler::Sidekiq.config.logger = Logger.new(io)
    yield
    io.string
  ensure
    Tumbler::Sidekiq.config.logger = nil
  end

  def teardown
    SidekiqHarness::SidekiqProcess.all.each(&:stop)
    SidekiqHarness::SidekiqProcess.all.clear
  end
end
