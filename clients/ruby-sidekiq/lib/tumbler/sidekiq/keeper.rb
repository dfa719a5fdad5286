# frozen_string_literal: true

module Tumbler
  module Sidekiq
    # The process's one thread for what its jobs' locks need besides their
    # start, so a job's thread makes no lock call of its own after it:
    #
    # - renewals: the execution lease of each running job is extended every
    #   third of its lease, pinned to its fencing token (a job shorter than
    #   that is never renewed). NOT_HELD, or renewals that fail until the
    #   lease has run out, mark the lock lost and raise LockLost in the
    #   job's thread while its job runs.
    # - releases: a job that ended hands its release here and goes on; they
    #   are sent in the order given, each pinned to its run's token, so a
    #   late one never touches a newer grant. A release waits up to `delay`
    #   (Config#release_delay, 5 ms) for others to go with it: those given
    #   meanwhile go together (up to BATCH) in one request
    #   (Client#release_many: one LockService.Batch, each release its own
    #   item and answer; items answered UNAVAILABLE are sent again until
    #   the client's timeout); one still without an answer is sent again
    #   alone, with the client's retries. The keeper is woken for the first
    #   release of a window only (the others find it already due to send),
    #   so a busy process pays one wake-up and one request per window, not
    #   one per job. Until one is sent the lock stays held (a duplicate pushed
    #   meanwhile meets the conflict strategy, as it would while the job
    #   ran); a killed process's unsent releases end with their leases.
    #
    # The process's exit waits for the releases given before (#stop). The
    # releases it sends are those of runs that ended, each under its run's
    # own holder and token, so no later lock call of the process depends on
    # their order.
    class Keeper
      Held = Struct.new(:lock, :thread, :due, :lease_end, :attempt)
      Release = Struct.new(:name, :holder, :token, :at)
      # The most releases sent in one request (the server's Batch limit).
      BATCH = Tumbler::Client::BATCH_MAX
      # How long (s) a release waits for others to go with it, by default.
      DELAY = 0.005

      # The keeper of this process, for its client (made again after a fork
      # or a new configure; the one it replaces sends what it was given).
      def self.current
        client = Sidekiq.client
        keeper = @current
        return keeper if keeper&.client.equal?(client)

        (@lock ||= Mutex.new).synchronize do
          keeper = @current
          unless keeper&.client.equal?(client)
            @current = new(client, Sidekiq.config.logger, delay: Sidekiq.config.release_delay)
            keeper.stop(1) if keeper&.pid == Process.pid
          end
        end
        @current
      end

      # Sends what the current keeper was given, then stops it.
      def self.shutdown(timeout = 5)
        keeper = @current
        keeper.stop(timeout) if keeper&.pid == Process.pid
      end

      attr_reader :pid, :client

      # delay: how long (s) a release waits for others to go with it (0: sent at once).
      def initialize(client, logger, delay: DELAY)
        @client = client
        @logger = logger
        @delay = delay.to_f
        @pid = Process.pid
        @mutex = Mutex.new
        @wake = ConditionVariable.new # the keeper thread's
        @done = ConditionVariable.new # a flush's: every release given so far was sent
        @held = {}.compare_by_identity # (entries change as they are renewed)
        @wake_at = Float::INFINITY # when the waiting keeper wakes next (-infinity: it is not waiting)
        @releases = []
        @sending = false
        @flushing = 0 # flushes waiting: what is given goes at once
        @stopping = false
        @thread = nil
      end

      # Keeps `lock` (a run's execution lease, granted with its lease
      # counted from `sent`) alive while its job runs on `thread`. Returns
      # the handle for #drop.
      def keep(lock, sent, thread = Thread.current)
        interval = lock.ttl_ms / 3000.0
        held = Held.new(lock, thread, sent + interval, sent + (lock.ttl_ms / 1000.0), 0)
        @mutex.synchronize do
          start_thread
          @held[held] = true
          @wake.signal if held.due < @wake_at # (a busy keeper looks again before it waits)
        end
        held
      end

      # Stops renewing; a LockLost that reached the job's thread after its
      # job ended is discarded (the caller masks it until then).
      def drop(held)
        @mutex.synchronize { @held.delete(held) }
        discard_pending_lost
      end

      # Sends the release later (within `delay`), in order, without waiting.
      def release_later(name, holder, token)
        now = Tumbler::Client.now
        @mutex.synchronize do
          start_thread
          @releases << Release.new(name, holder, token, now)
          # The keeper is woken only when it would otherwise wake too late:
          # for the first release of a window, or a full request's worth.
          due = @releases.size == 1 ? now + @delay : (@releases.size >= BATCH ? now : nil)
          @wake.signal if due && due < @wake_at
        end
      end

      # Waits (up to `timeout` s) until every release given so far is sent.
      def flush(timeout = 10)
        deadline = Tumbler::Client.now + timeout
        @mutex.synchronize do
          @flushing += 1
          begin
            @wake.signal if !@releases.empty? && @wake_at.positive? # waiting out a window: send now
            while (@sending || !@releases.empty?) && (left = deadline - Tumbler::Client.now).positive?
              @done.wait(@mutex, left)
            end
          ensure
            @flushing -= 1
          end
        end
      end

      # Sends what is left, then ends the thread.
      def stop(timeout = 5)
        flush(timeout)
        @mutex.synchronize do
          @stopping = true
          @wake.broadcast
        end
        @thread&.join(timeout)
      end

      private

      def start_thread
        return if @thread&.alive?

        @stopping = false
        @thread = Thread.new { run }
        @thread.name = 'tumbler-sidekiq-keeper' if @thread.respond_to?(:name=)
      end

      def run
        loop do
          work = next_work
          return unless work

          work.is_a?(Array) ? send_releases(work) : renew(work)
        end
      end

      # The releases to send (an Array, oldest first, at most BATCH) once the
      # oldest has waited `delay` (at once when a flush or the process's
      # exit waits, or a request's worth is there), else the next renewal
      # that is due (nil once stopping with nothing left); sleeps until one is.
      def next_work
        @mutex.synchronize do
          @sending = false
          loop do
            now = Tumbler::Client.now
            send_at = nil
            unless @releases.empty?
              send_at = @releases.first.at + @delay
              if send_at <= now || @flushing.positive? || @stopping || @releases.size >= BATCH
                @sending = true
                return @releases.shift(BATCH)
              end
            end
            @done.broadcast if @releases.empty? # a flush waiting for the releases
            return nil if @stopping

            due = @held.empty? ? nil : @held.keys.min_by(&:due)
            return due if due && due.due <= now

            @wake_at = [due&.due, send_at].compact.min || Float::INFINITY
            @wake.wait(@mutex, @wake_at.finite? ? @wake_at - now : nil)
            @wake_at = -Float::INFINITY
          end
        end
      end

      def send_releases(batch)
        return send_release(batch.first) if batch.size == 1

        results = @client.release_many(batch.map { |r| [r.name, r.holder, r.token] })
        batch.zip(results).each do |release, result|
          next unless result.is_a?(Tumbler::Error)

          # Unanswered (the connection ended, or the exchange's deadline): once more, alone,
          # with the client's retries. Pinned to its token, a second release is harmless.
          if [GRPC::Core::StatusCodes::UNAVAILABLE, GRPC::Core::StatusCodes::DEADLINE_EXCEEDED].include?(result.code)
            send_release(release)
          else
            release_failed(release, result)
          end
        end
      rescue StandardError => e
        @logger.warn("tumbler-sidekiq: #{batch.size} releases together failed (#{e.message}); sending them one by one")
        batch.each { |release| send_release(release) }
      end

      def send_release(release)
        @client.release(release.name, holder: release.holder, fencing_token: release.token)
      rescue StandardError => e
        release_failed(release, e)
      end

      def release_failed(release, e)
        @logger.warn("tumbler-sidekiq: could not release #{release.name} (#{release.holder}): #{e.message}; " \
                     'it ends with its lease')
      end

      def renew(held)
        lock = held.lock
        sent = Tumbler::Client.now
        begin
          lock.extend_lease
        rescue LockLost => e
          return lost(held, e)
        rescue StandardError => e
          # Any failure (a status, or the channel erroring while its server
          # restarts) is retried until the lease would end.
          if Tumbler::Client.now >= held.lease_end
            lock.send(:mark_lost, "renewals failed until the lease ran out (#{e.class.name})")
            return lost(held, lock.lost_error)
          end

          @mutex.synchronize { held.due = [Tumbler::Client.now + @client.backoff(held.attempt), held.lease_end].min }
          held.attempt += 1
          return
        end
        @mutex.synchronize do
          held.lease_end = sent + (lock.ttl_ms / 1000.0)
          held.due = sent + (lock.ttl_ms / 3000.0)
          held.attempt = 0
        end
      end

      # Told to the job's thread while its job runs (never after #drop).
      def lost(held, err)
        @mutex.synchronize do
          held.thread.raise(err) if @held.delete(held)
        end
      end

      def discard_pending_lost
        return unless Thread.pending_interrupt?(LockLost)

        Thread.handle_interrupt(LockLost => :immediate) { Thread.pass }
      rescue LockLost
        nil
      end
    end
  end
end
