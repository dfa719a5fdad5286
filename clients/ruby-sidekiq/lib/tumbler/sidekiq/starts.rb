# frozen_string_literal: true

module Tumbler
  module Sidekiq
    # The try-once Acquires that start jobs (a run taking its job's grant
    # over, or taking its runtime lock), sent together when they meet: the
    # first job to start while none is being sent sends its own at once (an
    # Acquire, as before); the jobs that start while that call is on its
    # way wait for it to end, and then one of them sends all theirs in one
    # request (Client#batch: one LockService.Batch, each Acquire its own
    # item, answered as its own call would be). A busy process so pays one
    # request, and the server one request's work, for several starts; an
    # idle one pays nothing more.
    #
    # Every item keeps its own holder (the run's), its own token and its own
    # answer, so nothing a run is promised changes: a take-over in a batch
    # is the same one step in the server. Starts whose request was cut (its
    # sender interrupted before the answer) are sent again by the next
    # sender: an Acquire is idempotent per holder, so one that landed is
    # answered ALREADY_HELD with the same grant.
    class Starts
      # One start: its Client#batch item and, once answered, its result
      # (a Tumbler::Lock, or the Tumbler::Error its own acquire would raise);
      # wake: signalled when it is answered or its turn to send comes (each
      # waiting thread is woken for its own reason only, never all at once).
      Start = Struct.new(:item, :result, :done, :wake)
      NEVER = { Object => :never }.freeze
      IMMEDIATE = { Object => :immediate }.freeze

      # The starts of this process's client (made again with a new client).
      def self.current
        client = Sidekiq.client
        starts = @current
        return starts if starts&.client.equal?(client)

        (@lock ||= Mutex.new).synchronize do
          @current = new(client) unless @current&.client.equal?(client)
        end
        @current
      end

      attr_reader :client

      def initialize(client)
        @client = client
        @mutex = Mutex.new
        @waiting = [] # starts not sent yet, in the order they came
        @sending = false
      end

      # The grant of a try-once Acquire of `name` with `options`
      # (Client#acquire's, without wait_ms), or nil when the lock is busy;
      # raises what Client#acquire raises.
      def acquire(name, **options)
        start = Start.new([:acquire, name, options], nil, false, ConditionVariable.new)
        @mutex.synchronize { @waiting << start }
        begin
          until start.done
            # An exception raised into this thread (a shutdown) may end its
            # wait for its turn, or its request, never the bookkeeping
            # around them: a sender always hands its turn on.
            Thread.handle_interrupt(NEVER) do
              batch = @mutex.synchronize do
                Thread.handle_interrupt(IMMEDIATE) { start.wake.wait(@mutex) while @sending && !start.done }
                next nil if start.done

                @sending = true
                @waiting.shift(Tumbler::Client::BATCH_MAX)
              end
              send_batch(batch) if batch
            end
          end
        ensure
          unless start.done
            # Interrupted before its answer (a shutdown): no longer to be sent;
            # the next start in line sends, if nobody is sending.
            Thread.handle_interrupt(NEVER) do
              @mutex.synchronize do
                @waiting.delete(start)
                @waiting.first&.wake&.signal unless @sending
              end
            end
          end
        end
        result = start.result
        return nil if result.is_a?(Tumbler::NotAcquired)
        raise result if result.is_a?(Exception)

        result
      end

      private

      def send_batch(batch)
        results = nil
        begin
          results = Thread.handle_interrupt(IMMEDIATE) do
            batch.size == 1 ? [single(*batch.first.item)] : @client.batch(batch.map(&:item))
          end
        rescue Tumbler::Error => e # refused whole: each start fails as its own call would have
          results = Array.new(batch.size, e)
        ensure
          following = nil
          @mutex.synchronize do
            if results
              batch.each_with_index do |start, i|
                start.result = results[i]
                start.done = true
              end
            else
              @waiting.unshift(*batch) # cut before its answer: sent again by the next sender
            end
            @sending = false
            following = @waiting.first
          end
          # Woken once the mutex is free (a thread woken while it is held
          # would only wait for it again): they go on, and the next in line
          # sends. (A start marked done under the mutex is seen so by its
          # thread before it waits, so no wake-up is lost.)
          batch.each { |start| start.wake.signal if start.done }
          following&.wake&.signal
        end
      end

      # One start alone: the ordinary Acquire.
      def single(_kind, name, options)
        @client.acquire(name, **options)
      rescue Tumbler::Error => e
        e
      end
    end
  end
end
