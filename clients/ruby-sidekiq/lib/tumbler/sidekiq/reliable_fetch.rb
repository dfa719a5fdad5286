# frozen_string_literal: true

require 'socket'
require 'securerandom'
require 'sidekiq/fetch'

module Tumbler
  module Sidekiq
    # A Sidekiq 6 fetch strategy that does not lose the job of a killed
    # worker. A fetched job moves (LMOVE, atomic) from its queue to this
    # process's working list and leaves it when it is acknowledged; each
    # process keeps a heartbeat key alive. A process whose heartbeat has
    # lapsed (SIGKILL, OOM, a lost node) is dead: any live process moves its
    # working list back to the queues, ahead of waiting jobs, at its start
    # and every recover_interval. On a graceful shutdown the jobs still
    # running go back to their queues (as with Sidekiq's BasicFetch) and
    # keep their until_executed locks.
    #
    # A process whose heartbeat lapsed stays in the processes set (and its
    # list is looked at again on every pass) until its list has stayed empty
    # for GRACE_MS: a paused process (SIGSTOP) may still have fetches
    # blocked in Redis, which move a job into its working list up to
    # TIMEOUT seconds after its last command, after its heartbeat lapsed
    # and its list was recovered.
    #
    # Keys (in Sidekiq's Redis): tumbler-sidekiq:processes (SET of process
    # ids), tumbler-sidekiq:alive:<id> (heartbeat, PX heartbeat_ttl),
    # tumbler-sidekiq:working:<id> (LIST of job payloads),
    # tumbler-sidekiq:dead (HASH: a dead process's id -> when its list was
    # last found with jobs, or first found empty, ms of Redis' clock; the
    # entry goes with the id).
    class ReliableFetch
      TIMEOUT = 2 # seconds a fetch blocks on an empty queue, as Sidekiq's BasicFetch
      GRACE_MS = (TIMEOUT * 1000) + 1000
      PREFIX = 'tumbler-sidekiq'
      PROCESSES = "#{PREFIX}:processes"
      DEAD = "#{PREFIX}:dead"

      # Moves the working lists of dead processes back to the head of their
      # queues, in one script so two live processes never both recover one list.
      # ARGV[3] = '1': this process stops; its own list goes back too.
      # ARGV[4]: GRACE_MS.
      RECOVER = <<~LUA
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        local moved = 0
        for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
          local mine = id == ARGV[1]
          if (mine and ARGV[3] == '1') or (not mine and redis.call('EXISTS', ARGV[2] .. ':alive:' .. id) == 0) then
            local working = ARGV[2] .. ':working:' .. id
            local n = 0
            while true do
              local job = redis.call('RPOP', working)
              if not job then break end
              local ok, item = pcall(cjson.decode, job)
              local queue = 'default'
              if ok and type(item) == 'table' and type(item['queue']) == 'string' then queue = item['queue'] end
              redis.call('RPUSH', 'queue:' .. queue, job)
              n = n + 1
            end
            moved = moved + n
            local since = tonumber(redis.call('HGET', KEYS[2], id))
            if mine or (n == 0 and since and now - since >= tonumber(ARGV[4])) then
              redis.call('SREM', KEYS[1], id)
              redis.call('HDEL', KEYS[2], id)
            elseif n > 0 or not since then
              redis.call('HSET', KEYS[2], id, now)
            end
          end
        end
        return moved
      LUA

      UnitOfWork = Struct.new(:queue, :job, :working) do
        def acknowledge = ::Sidekiq.redis { |conn| conn.lrem(working, -1, job) }
        def queue_name = queue.delete_prefix('queue:')

        def requeue
          ::Sidekiq.redis do |conn|
            conn.multi do |tx|
              tx.rpush(queue, job)
              tx.lrem(working, -1, job)
            end
          end
        end
      end

      attr_reader :identity, :working

      def initialize(options, heartbeat_ttl: Sidekiq.config.heartbeat_ttl,
                     recover_interval: Sidekiq.config.recover_interval)
        raise ArgumentError, 'missing queue list' unless options[:queues]

        @strict = !!options[:strict]
        @queues = options[:queues].map { |q| "queue:#{q}" }
        @queues.uniq! if @strict
        @heartbeat_ms = (heartbeat_ttl * 1000).round
        # A fetch longer than this (s) may have outlived this process's
        # heartbeat: beats come every third of heartbeat_ttl.
        @stale_after = heartbeat_ttl * 2 / 3.0
        @recover_interval = recover_interval
        @identity = "#{Socket.gethostname}:#{Process.pid}:#{SecureRandom.hex(6)}"
        @working = "#{PREFIX}:working:#{@identity}"
        @done = false
        @mutex = Mutex.new
        @wake = ConditionVariable.new
        beat
        recover
        @thread = Thread.new { heartbeat_loop }
      end

      def retrieve_work
        started = now
        work = fetch
        return work unless work && now - started > @stale_after

        still_mine?(work) ? work : nil
      end

      # Sidekiq's hard shutdown hands over the jobs still running (before it
      # kills their threads); Launcher#stop calls it once more, empty, last.
      def bulk_requeue(inprogress, _options = nil)
        unless inprogress.empty?
          ::Sidekiq.redis do |conn|
            conn.multi do |tx|
              inprogress.each do |work|
                tx.rpush(work.queue, work.job)
                tx.lrem(@working, -1, work.job)
              end
            end
          end
          ::Sidekiq.logger.info("Pushed #{inprogress.size} jobs back to Redis")
          return
        end
        stop
      rescue StandardError => e
        ::Sidekiq.logger.warn("Failed to requeue #{inprogress.size} jobs: #{e.message}")
      end

      # Jobs of dead processes (and, when stopping, this one's) put back in
      # their queues; the count.
      def recover(own: false)
        moved = ::Sidekiq.redis do |conn|
          conn.eval(RECOVER, keys: [PROCESSES, DEAD], argv: [@identity, PREFIX, own ? '1' : '0', GRACE_MS])
        end
        ::Sidekiq.logger.warn("tumbler-sidekiq: recovered #{moved} jobs of dead processes") if moved.positive? && !own
        moved
      end

      # The end of the process (Launcher#stop, after its worker threads were
      # stopped or killed): no heartbeat any more, and whatever is left in
      # the working list goes back to its queue. A thread killed while its
      # fetch was blocked can leave a job there (Redis moved it, the reply
      # was lost); with Sidekiq's BasicFetch that job would be lost.
      def stop
        @mutex.synchronize do
          @done = true
          @wake.signal
        end
        @thread&.join(2)
        moved = recover(own: true)
        ::Sidekiq.logger.info("Pushed #{moved} fetched jobs back to Redis") if moved.positive?
        ::Sidekiq.redis { |conn| conn.del("#{PREFIX}:alive:#{@identity}") }
      end

      private

      def fetch
        qs = queues_cmd
        ::Sidekiq.redis do |conn|
          qs[0..-2].each do |queue|
            job = conn.lmove(queue, @working, 'RIGHT', 'LEFT')
            return UnitOfWork.new(queue, job, @working) if job
          end
          job = conn.blmove(qs.last, @working, 'RIGHT', 'LEFT', timeout: TIMEOUT)
          job && UnitOfWork.new(qs.last, job, @working)
        end
      end

      # A fetch that took long enough for this process's heartbeat to lapse
      # (the process was paused, SIGSTOP, while Redis moved the job into
      # its working list) may hand over a job another process has since
      # recovered from that list and runs: run it only if it is still there.
      def still_mine?(work)
        return true if ::Sidekiq.redis { |conn| conn.call(['LPOS', @working, work.job]) }

        jid = begin
          ::Sidekiq.load_json(work.job)['jid']
        rescue StandardError
          nil
        end
        ::Sidekiq.logger.warn("tumbler-sidekiq: not running job #{jid} fetched before this process was paused: " \
                              'it was recovered from this process\'s working list, another process runs it')
        false
      end

      def beat
        ::Sidekiq.redis do |conn|
          conn.multi do |tx|
            tx.respond_to?(:sadd?) ? tx.sadd?(PROCESSES, @identity) : tx.sadd(PROCESSES, @identity)
            tx.set("#{PREFIX}:alive:#{@identity}", '1', px: @heartbeat_ms)
            tx.hdel(DEAD, @identity) # back from a pause: its grace starts afresh if it dies
          end
        end
      end

      def heartbeat_loop
        next_beat = next_recover = now
        loop do
          @mutex.synchronize do
            @wake.wait(@mutex, [[next_beat, next_recover].min - now, 0.01].max) unless @done
          end
          break if @done

          begin
            if now >= next_beat
              beat
              next_beat = now + (@heartbeat_ms / 3000.0)
            end
            if now >= next_recover
              recover
              next_recover = now + @recover_interval
            end
          rescue StandardError => e
            ::Sidekiq.logger.warn("tumbler-sidekiq: heartbeat: #{e.message}")
            next_beat = now + 1
          end
        end
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

      def queues_cmd
        return @queues if @strict

        @queues.shuffle.uniq
      end
    end
  end
end
