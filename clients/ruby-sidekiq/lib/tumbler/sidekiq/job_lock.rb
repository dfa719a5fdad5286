# frozen_string_literal: true

require 'securerandom'
require 'sidekiq/api'

module Tumbler
  module Sidekiq
    # The locks of one job: taken when it is pushed (client side) and while
    # it runs (server side), as its lock type says.
    #
    # Two holders. While the job waits (in a queue, the schedule, for a
    # retry) its lock's holder is the job id, so a scheduled job coming
    # due, a retry or a requeued job pushed again finds its own grant
    # (Acquire is idempotent per holder) instead of conflicting with itself.
    # While it runs, the holder is the run's own, "<jid>:<run id>" (one
    # JobLock per execution), with a fencing token of its own: two
    # executions of one job (a paused process whose job was handed to
    # another) never share a grant, and every renewal and release is pinned
    # to the run's token, so a stale run is told NOT_HELD and never touches
    # the newer run's grant.
    #
    # Lock calls on a job's path: one when it is pushed (Acquire), one when
    # it starts (until_executed: an Acquire that takes the queued grant over
    # for the run, `takes_over`, one step in the server, sent together with
    # other jobs' starts that meet it (Starts); until_executing:
    # the release; while_executing: the runtime lock's Acquire; and
    # until_and_while_executing, which has two locks, both). Renewals and
    # the release at its end are the process's Keeper's, off the job's
    # thread: the lock stays held until that release is sent, a few
    # milliseconds at most after the job's end.
    class JobLock
      RUN_SUFFIX = ':RUN'
      # Added to execution_ttl when a run waits for another run of the same
      # job to end or lapse (ms).
      OTHER_RUN_GRACE_MS = 2_000
      # Thread.handle_interrupt's masks, made once (a job runs three).
      SHUTDOWN_NEVER = { ::Sidekiq::Shutdown => :never }.freeze
      LOST_NEVER = { LockLost => :never }.freeze
      LOST_IMMEDIATE = { LockLost => :immediate }.freeze

      attr_reader :options, :item, :digest

      def initialize(options, item, config = Sidekiq.config)
        @options = options
        @item = item
        @config = config
        @digest = (item['lock_digest'] ||= options.digest(item))
      end

      def jid = item['jid']
      def runtime_digest = "#{digest}#{RUN_SUFFIX}"

      # The holder of this execution's grants: the jid and an id of this run
      # alone (made once, so a retried Acquire of the run stays idempotent).
      def run_holder = (@run_holder ||= "#{jid}:#{SecureRandom.hex(8)}")

      # Is this grant's holder this job (its queued grant, or one of its runs)?
      def self.job_of(holder) = holder.to_s.sub(/:\h{16}\z/, '')

      # Client side: take the digest's lock for the job (holder: its jid)
      # and push it (the block); on a conflict, the client strategy decides.
      # A push never waits (lock_timeout is for running jobs), as in
      # sidekiq-unique-jobs v9 and Sidekiq Enterprise.
      def push(&push)
        return yield unless options.client_lock?

        lock = acquire(digest, ttl_ms: queued_ttl_ms)
        return client_conflict(&push) unless lock

        push_holding(lock, &push)
      end

      # Client side, inside a push_bulk (Bulk): the rest of the chain runs
      # now; the lock of a job that came through it is taken with the
      # others' in one request just before the jobs are pushed.
      def defer_push(bulk)
        return yield unless options.client_lock?

        result = yield
        bulk.defer(self, result) if result
        result
      end

      # This job's push-time Acquire as a Client#batch item.
      def bulk_acquire
        [:acquire, digest, { holder: jid, ttl_ms: queued_ttl_ms, limit: options.limit, kind: options.kind,
                             metadata: metadata }]
      end

      # The busy lock of a job of a push_bulk meets its client strategy, as
      # a single push's would (the block pushes: it gives the payload);
      # truthy when the job is to be pushed. first: the jid of an earlier
      # job of the same push_bulk that took this digest (it is not in a
      # queue yet, so :replace cannot replace it: the first wins).
      def bulk_conflict(first: nil, &push)
        if first && options.on_client_conflict == :replace
          return log_conflict(:client, "skipping (job #{first} of the same push_bulk holds it, not replaced)")
        end

        client_conflict(&push)
      end

      # Server side: run the job (the block) under its lock type's rules.
      def execute(worker, &perform)
        case options.type
        when :until_executing then run_until_executing(worker, &perform)
        when :until_executed then run_until_executed(worker, &perform)
        when :until_expired then run_until_expired(worker, &perform)
        when :while_executing then run_while_executing(worker, &perform)
        when :until_and_while_executing
          release_quietly(digest)
          run_while_executing(worker, relock: true, &perform)
        end
      end

      private

      def client = (@client ||= Sidekiq.client) # (one job, one process: looked up once)
      def keeper = (@keeper ||= Keeper.current)
      def logger = @config.logger

      # The lease while the job waits in a queue (or in the schedule, or for
      # a retry): lock_ttl (default max_lock_ttl) plus the time until it is
      # due, capped at max_lock_ttl.
      def queued_ttl_ms
        secs = options.ttl || @config.max_lock_ttl
        secs += [item['at'].to_f - Time.now.to_f, 0].max if item['at']
        ms([secs, @config.max_lock_ttl].min)
      end

      def execution_ttl_ms = ms(options.execution_ttl)

      # lock_timeout: seconds a job about to run waits for its lock in
      # tumbler's fair queue (the waiting happens in the tumbler server: no
      # polling); nil waits as long as the server allows (max_lock_timeout).
      def wait_ms
        t = options.timeout
        t = @config.max_lock_timeout if t.nil? || t > @config.max_lock_timeout
        t.positive? ? ms(t) : 0
      end

      def ms(secs) = [(secs * 1000).round, 1].max

      def metadata
        meta = { 'class' => item['class'].to_s, 'queue' => item['queue'].to_s, 'jid' => jid.to_s,
                 'lock' => options.kind }
        meta['at'] = item['at'].to_s if item['at']
        meta
      end

      # A grant for this job (holder: the jid, or a run's holder), or nil
      # when the lock is busy (or the wait timed out). takes_over: a holder
      # whose grant passes to this one in the same call (when it holds one).
      # @sent: when it was asked (the lease counts from there).
      def acquire(name, ttl_ms:, wait_ms: 0, holder: jid, takes_over: nil)
        @sent = Tumbler::Client.now
        extra = takes_over ? { takes_over: takes_over } : {}
        client.acquire(name, holder: holder, ttl_ms: ttl_ms, wait_ms: wait_ms, limit: options.limit,
                             kind: options.kind, metadata: metadata, **extra)
      rescue Tumbler::NotAcquired
        nil
      end

      # The run's own grant on `name`, in one call: the job's queued grant
      # (holder: the jid), when the lock type took one at push time, passes
      # to the run's holder with a fresh token (takes_over; only one run of
      # the job can take it); when the jid holds none (it lapsed, or another
      # run took it) the lock is taken as usual, waiting up to
      # lock_timeout. If the lock is held by another run of this same
      # job (a redelivered job whose first run is paused, or was killed and
      # its lease has not ended yet), this run waits for that run's lease to
      # end or for it to finish: up to execution_ttl, whatever lock_timeout
      # says, so a killed run's job is not dropped.
      def run_grant(name, queued:)
        queued_holder = queued ? jid : nil
        wait = wait_ms
        lock = if wait.zero?
                 start(name, takes_over: queued_holder)
               else
                 acquire(name, holder: run_holder, ttl_ms: execution_ttl_ms, wait_ms: wait, takes_over: queued_holder)
               end
        return lock if lock

        mine = client.inspect_lock(name).holders.map(&:grant).select { |g| JobLock.job_of(g.holder) == jid }
        return nil if mine.empty?

        # (the jid's grant, if another run handed it back meanwhile, is taken over)
        acquire(name, holder: run_holder, ttl_ms: execution_ttl_ms, takes_over: queued_holder,
                      wait_ms: [wait_ms, execution_ttl_ms + OTHER_RUN_GRACE_MS].max)
      end

      # The run's try-once Acquire (holder: the run's, execution lease), sent
      # with the other starts of this process that meet it (Starts).
      def start(name, takes_over:)
        @sent = Tumbler::Client.now
        opts = { holder: run_holder, ttl_ms: execution_ttl_ms, limit: options.limit, kind: options.kind,
                 metadata: metadata }
        opts[:takes_over] = takes_over if takes_over
        Starts.current.acquire(name, **opts)
      end

      # Pushes while holding a fresh grant; gives it back if the push fails
      # or a later middleware drops the job.
      def push_holding(lock)
        pushed = false
        result = yield
        pushed = result ? true : false
        result
      ensure
        release_quietly(digest, lock.fencing_token) unless pushed || lock.already_held?
      end

      def release_quietly(name, token = nil, holder: jid)
        client.release(name, holder: holder, fencing_token: token)
      rescue Tumbler::Error => e
        logger.warn("tumbler-sidekiq: could not release #{name} for job #{jid}: #{e.message}")
        false
      end

      # --- server side, by lock type

      def run_until_executing(worker)
        release_quietly(digest)
        expose(worker, nil)
        begin
          yield
        rescue Exception => e # rubocop:disable Lint/RescueException -- a shutdown too: the job goes back to its queue
          relock_until if comes_back?(e)
          raise
        end
      end

      # The lock taken at push time becomes the run's own execution lease
      # (run_grant; renewed by the watchdog, pinned to the run's token); if
      # it lapsed meanwhile and nobody took it, the run takes it again.
      # Released on success (by the Keeper, off the job's thread); handed
      # back to the job (holder: the jid, on a queued lease) when the job
      # goes back to a queue or waits for a retry.
      def run_until_executed(worker, &perform)
        lock = run_grant(digest, queued: true)
        return server_conflict unless lock

        run_held(worker, lock, perform) do |outcome|
          if lock.lost?
            nil # gone already: nothing to give back or keep
          elsif outcome == :done || outcome == :dropped
            keeper.release_later(digest, run_holder, lock.fencing_token)
          else
            requeue_lease(lock)
          end
        end
      end

      # Held until its lease ends, whatever the job does; the job runs only
      # if this jid still holds it (or takes it again).
      def run_until_expired(worker)
        lock = acquire(digest, ttl_ms: ms(options.ttl || @config.max_lock_ttl))
        return server_conflict unless lock

        expose(worker, lock)
        yield
      end

      # The runtime lock (digest:RUN, limit lock_limit), waited for up to
      # lock_timeout in tumbler's fair queue; released however the job ends.
      def run_while_executing(worker, relock: false, &perform)
        lock = begin
          run_grant(runtime_digest, queued: false)
        rescue Exception => e # rubocop:disable Lint/RescueException -- a shutdown while waiting
          relock_until if relock && comes_back?(e)
          raise
        end
        return server_conflict unless lock

        run_held(worker, lock, perform) do |outcome|
          keeper.release_later(runtime_digest, run_holder, lock.fencing_token)
          relock_until if relock && %i[requeued retried].include?(outcome)
        end
      end

      # Runs the job with the Keeper renewing `lock` (LockLost is raised
      # in the job if the grant is lost), then calls finish with the
      # outcome: :done, :requeued (shutdown), :retried (failed, a retry
      # will come) or :dropped (failed for good). A shutdown cannot
      # interrupt finish.
      def run_held(worker, lock, perform, &finish)
        expose(worker, lock)
        outcome = :dropped
        begin
          hold(lock, perform)
          outcome = :done
        rescue Exception => e # rubocop:disable Lint/RescueException -- decide the lock's fate, then re-raise
          outcome = e.is_a?(::Sidekiq::Shutdown) ? :requeued : (retried?(e) ? :retried : :dropped)
          raise
        ensure
          Thread.handle_interrupt(SHUTDOWN_NEVER) { finish.call(outcome) }
        end
      end

      # The job runs with its lease kept by the Keeper; LockLost reaches
      # it only while it runs.
      def hold(lock, perform)
        Thread.handle_interrupt(LOST_NEVER) do
          held = keeper.keep(lock, @sent || Tumbler::Client.now)
          begin
            Thread.handle_interrupt(LOST_IMMEDIATE) { perform.call }
          ensure
            keeper.drop(held)
          end
        end
      end

      # The job goes back to a queue (shutdown) or waits for its retry: its
      # until-lock returns to the job (holder: the jid) on a queued lease so
      # no duplicate slips in, and the next run takes it over as its own.
      # In one call: the run's grant passes back to the jid (takes_over; a
      # stale run holds none, so it takes nothing from a newer run's).
      def requeue_lease(lock)
        return if lock.lost?
        return if acquire(digest, ttl_ms: queued_ttl_ms, takes_over: run_holder)

        logger.warn("tumbler-sidekiq: #{digest} was taken as job #{jid} went back to wait; " \
                    'its next run meets the conflict strategy')
      rescue Tumbler::Error => e
        logger.warn("tumbler-sidekiq: could not keep #{digest} for job #{jid}: #{e.message}")
      end

      # until_executing / until_and_while_executing: a job that goes back to
      # a queue takes its until-lock again (if nobody took it since).
      def relock_until
        acquire(digest, ttl_ms: queued_ttl_ms)
      rescue Tumbler::Error => e
        logger.warn("tumbler-sidekiq: could not lock #{digest} again for job #{jid}: #{e.message}")
      end

      def comes_back?(err) = err.is_a?(::Sidekiq::Shutdown) || retried?(err)

      # Will Sidekiq retry this job after this failure? (JobRetry runs
      # outside the server middleware, so retry_count is the previous one.)
      def retried?(err)
        return false unless err.is_a?(StandardError)

        max = case item['retry']
              when true, nil then ::Sidekiq.options.fetch(:max_retries, 25)
              when false then 0
              else Integer(item['retry'])
              end
        count = item['retry_count'] ? item['retry_count'].to_i + 1 : 0
        count < max
      rescue ArgumentError, TypeError
        false
      end

      def expose(worker, lock)
        worker.tumbler_lock = lock if worker.respond_to?(:tumbler_lock=)
        Thread.current[:tumbler_sidekiq_lock] = lock
      end

      # --- conflicts

      def client_conflict(&push)
        case options.on_client_conflict
        when :raise then raise Conflict.new(item, digest, :client)
        when :reject then reject(:client)
        when :replace then replace(&push)
        when :reschedule then reschedule_push(&push)
        else log_conflict(:client)
        end
      end

      def server_conflict
        case options.on_server_conflict
        when :raise then raise Conflict.new(item, digest, :server)
        when :reject then reject(:server)
        when :reschedule then reschedule_server
        else log_conflict(:server)
        end
      end

      def log_conflict(side, what = 'skipping')
        logger.info("tumbler-sidekiq: #{what} job #{jid} (#{item['class']}) on #{side}: #{side == :server && options.runtime_lock? ? runtime_digest : digest} " \
                    "is locked (#{options.type}, limit #{options.limit})")
        nil
      end

      # To the dead set, as Sidekiq would put a job that ran out of retries.
      def reject(side)
        log_conflict(side, 'rejecting (to the dead set)')
        ::Sidekiq::DeadSet.new.kill(::Sidekiq.dump_json(item), notify_failure: false)
        nil
      end

      # Push it into the schedule, schedule_in seconds from now, without a
      # lock: when it comes due, Sidekiq's poller pushes it through this
      # middleware again, which tries the lock again.
      def reschedule_push
        log_conflict(:client, "rescheduling (in #{options.schedule_in} s)")
        item['at'] = Time.now.to_f + options.schedule_in
        item['tumbler_rescheduled'] = item['tumbler_rescheduled'].to_i + 1
        yield
      end

      # The same job (same jid) scheduled again schedule_in seconds from now;
      # this run ends without running it.
      def reschedule_server
        log_conflict(:server, "rescheduling (in #{options.schedule_in} s)")
        copy = item.merge('at' => Time.now.to_f + options.schedule_in,
                          'tumbler_rescheduled' => item['tumbler_rescheduled'].to_i + 1)
        ::Sidekiq::Client.push(copy)
        nil
      end

      # Delete the job(s) holding the digest from their queue, the schedule
      # or the retry set, give their locks back, and push this one in their
      # place. A holder that is already running cannot be replaced: then
      # this job is dropped (logged), as in sidekiq-unique-jobs.
      def replace(&push)
        grants = client.inspect_lock(digest).holders.map(&:grant).reject { |g| JobLock.job_of(g.holder) == jid }
        replaced = grants.any? do |grant| # a running job's holder is its run's, "<jid>:<run>": not in a queue
          next false unless delete_job(grant.holder, grant.metadata['queue'] || item['queue'])

          client.release(digest, holder: grant.holder, fencing_token: grant.fencing_token)
          logger.info("tumbler-sidekiq: replaced job #{grant.holder} with #{jid} (#{digest})")
          true
        end
        lock = replaced && acquire(digest, ttl_ms: queued_ttl_ms)
        return log_conflict(:client, 'skipping (the holder is running, not replaced)') unless lock

        push_holding(lock, &push)
      end

      def delete_job(old_jid, queue)
        [::Sidekiq::Queue.new(queue), ::Sidekiq::ScheduledSet.new, ::Sidekiq::RetrySet.new].any? do |set|
          found = set.find_job(old_jid)
          found&.delete
        end
      end
    end
  end
end
