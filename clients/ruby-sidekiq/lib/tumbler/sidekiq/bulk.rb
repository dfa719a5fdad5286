# frozen_string_literal: true

module Tumbler
  module Sidekiq
    # Sidekiq::Client#push_bulk of unique jobs takes all their push-time
    # locks in one request (Client#batch, LockService.Batch), not one
    # Acquire per job.
    #
    # Sidekiq's push_bulk runs the client middleware once per job, then
    # pushes the jobs that came through in one raw_push. While a push_bulk
    # runs on a thread (BulkPush, prepended to Sidekiq::Client), the
    # middleware notes each unique job that came through the rest of the
    # chain instead of acquiring its lock (JobLock#defer_push); just before
    # raw_push, #resolve acquires them all in one Batch (items of one digest
    # in the jobs' order: of two jobs with the same digest, the first
    # wins), and decides each job as a single push would:
    #
    # - granted: pushed; its lock's holder is its jid, as for a single push.
    # - busy: the job's client conflict strategy, as for a single push:
    #   dropped and logged (default), rejected to the dead set, replaced
    #   (the holder's job deleted from its queue and this one pushed; not
    #   when the holder is an earlier job of this same push_bulk: the first
    #   wins), rescheduled (pushed into the schedule without a lock), or
    #   :raise, which raises Conflict from push_bulk with nothing pushed
    #   and the grants this push_bulk took given back.
    # - any other error (Unavailable after the client's retries, ...):
    #   push_bulk raises it, nothing is pushed, and the grants it took are
    #   given back (as a single push raises and pushes nothing).
    #
    # A job dropped is taken out of push_bulk's payloads (in place), so its
    # jid is not returned. A job whose lock was taken is never dropped
    # here, and no job is pushed without its lock.
    class Bulk
      KEY = :tumbler_sidekiq_bulk

      def self.current = Thread.current[KEY]

      def initialize
        @entries = [] # [JobLock, the payload it stands for]
      end

      def empty? = @entries.empty?

      # The middleware's: this job came through the chain; its lock is taken in #resolve.
      def defer(job_lock, payload)
        @entries << [job_lock, payload]
      end

      # Takes the deferred locks of these payloads in one Batch and removes
      # from `payloads` (in place) the jobs a single push would not push.
      def resolve(payloads)
        listed = {}.compare_by_identity
        payloads.each { |p| listed[p] = true }
        entries = @entries.select { |_, payload| listed[payload] }
        return if entries.empty?

        results = begin
          Sidekiq.client.batch(entries.map { |job_lock, _| job_lock.bulk_acquire })
        rescue Tumbler::Error => e
          # A later request of a bulk over 256 jobs refused whole (the
          # token's rate, the request's size): what the earlier ones took
          # goes back, and nothing is pushed.
          give_back_and_raise(taken_by(entries, e.batch_results || []), e)
        end
        taken = taken_by(entries, results)
        failed = results.find { |r| r.is_a?(Tumbler::Error) && !r.is_a?(Tumbler::NotAcquired) }
        give_back_and_raise(taken, failed) if failed

        dropped = {}.compare_by_identity
        winners = {} # digest -> the jid of this bulk that holds it
        entries.zip(results).each do |(job_lock, payload), r|
          if r.is_a?(Tumbler::Lock)
            winners[job_lock.digest] ||= job_lock.jid
            next
          end
          kept = begin
            job_lock.bulk_conflict(first: winners[job_lock.digest]) { payload }
          rescue Exception => e # rubocop:disable Lint/RescueException -- :raise (or a failing strategy): nothing is pushed
            give_back_and_raise(taken, e)
          end
          dropped[payload] = true unless kept
        end
        payloads.reject! { |p| dropped[p] } unless dropped.empty?
      end

      private

      # [digest, jid, token] of each grant these results hold that this
      # push_bulk took (not one its holder held already).
      def taken_by(entries, results)
        entries.zip(results).filter_map do |(job_lock, _), r|
          [job_lock.digest, job_lock.jid, r.fencing_token] if r.is_a?(Tumbler::Lock) && !r.already_held?
        end
      end

      # The grants this push_bulk took go back (pinned to their tokens, in
      # one Batch); then the push fails with `err`.
      def give_back_and_raise(taken, err)
        give_back(taken)
        raise err
      end

      # A give-back refused whole for the token's request rate
      # (RESOURCE_EXHAUSTED: the bulk that failed so spent the budget, each
      # of its items counting as one call, and a refused Batch spends what
      # it was charged before the refusal) goes again in requests half as
      # big, with back-off, until rpc_timeout: a grant left behind would hold
      # its job's digest, with no job, for the queued lease (a day by default).
      def give_back(taken)
        client = Sidekiq.client
        deadline = Tumbler::Client.now + Sidekiq.config.rpc_timeout
        chunk = Tumbler::Client::BATCH_MAX
        attempt = 0
        until taken.empty?
          part = taken.first(chunk)
          begin
            client.release_many(part, timeout: [deadline - Tumbler::Client.now, 0.001].max).each_with_index do |r, i|
              warn_kept(part[i], r.message) if r.is_a?(Tumbler::Error)
            end
          rescue Tumbler::Error => e
            pause = [client.backoff(attempt), deadline - Tumbler::Client.now].min
            raise unless e.code == GRPC::Core::StatusCodes::RESOURCE_EXHAUSTED && pause.positive?

            chunk = [chunk / 2, 1].max
            attempt += 1
            sleep pause
            next
          end
          taken = taken.drop(part.size)
        end
      rescue StandardError => e
        taken.each { |t| warn_kept(t, e.message) }
      end

      def warn_kept((digest, jid, _token), why)
        Sidekiq.config.logger.warn("tumbler-sidekiq: could not give back #{digest} of job #{jid} after a failed " \
                                   "push_bulk: #{why}; it ends with its lease")
      end
    end

    # Prepended to Sidekiq::Client: a push_bulk collects its jobs' locks
    # (Bulk) and takes them in one request before its raw_push. A single
    # push, also one made inside a push_bulk (by a middleware, or a
    # conflict strategy), takes its lock as always.
    module BulkPush
      def push(item)
        outer = Thread.current[Bulk::KEY]
        Thread.current[Bulk::KEY] = nil
        super
      ensure
        Thread.current[Bulk::KEY] = outer
      end

      def push_bulk(items)
        outer = Thread.current[Bulk::KEY]
        Thread.current[Bulk::KEY] = Bulk.new
        super
      ensure
        Thread.current[Bulk::KEY] = outer
      end

      private

      def raw_push(payloads)
        bulk = Thread.current[Bulk::KEY]
        return super if bulk.nil? || bulk.empty?

        Thread.current[Bulk::KEY] = nil # what resolving pushes (replace, reschedule) is a single push
        bulk.resolve(payloads)
        return true if payloads.empty?

        # Sidekiq pushes one raw_push either all into the schedule or all
        # into the queue: a rescheduled job goes with the scheduled ones.
        scheduled, queued = payloads.partition { |p| p.key?('at') }
        super(queued) unless queued.empty?
        super(scheduled) unless scheduled.empty?
        true
      end
    end
  end
end
