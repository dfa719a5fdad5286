#!/usr/bin/env ruby
# frozen_string_literal: true

# Ruby seed patterns of clients/ruby/README.md, run by the conformance driver:
# unique jobs (a uniqueness window keyed on a digest of job class + arguments,
# like Sidekiq Enterprise's unique_for / unique_until), and one leader among
# replicas (leader election).
#
# usage: examples.rb ADDR NAMESPACE all
#        examples.rb ADDR NAMESPACE enqueue CLASS ARGS_JSON JOB_ID WINDOW_MS
#        examples.rb ADDR NAMESPACE perform CLASS ARGS_JSON JOB_ID
require 'digest'
require 'json'
require 'tumbler'

module UniqueJobs
  module_function

  # The same digest in every language: sha256 of "<class>:<compact JSON of args>".
  def lock_name(job_class, args)
    "unique/#{job_class}/#{Digest::SHA256.hexdigest("#{job_class}:#{JSON.generate(args)}")}"
  end

  # true: push the job; false: the same job is already queued or running within the window.
  def enqueue(client, job_class, args, jid, unique_for:)
    client.acquire(lock_name(job_class, args), holder: jid, ttl_ms: unique_for, kind: 'unique')
    true
  rescue Tumbler::NotAcquired
    false
  end

  # Runs the block for a job pushed by enqueue. unique_until: :start frees the
  # digest as the job starts; :success (default) once the block returns, so a
  # job that raises stays unique (for its retries) until the window ends.
  def perform(client, job_class, args, jid, unique_until: :success)
    release = lambda do
      client.stub.release(Tumbler::V1::ReleaseRequest.new(namespace: client.namespace,
                                                           name: lock_name(job_class, args), holder: jid))
    end
    release.call if unique_until == :start
    result = yield(*args)
    release.call if unique_until == :success
    result
  end
end

# Runs the block while this replica leads `election`; nil when another one led
# for the whole wait. The value others see is this replica's address.
# Tumbler::NotLeader is raised in the block if the term ends under it.
def run_as_leader(client, election, me, &work)
  client.campaign(election, value: me, wait_ms: 5000, ttl_ms: 3000, &work) # resigns when the block ends
end

def election_checks(client, check)
  term = run_as_leader(client, 'rb.scheduler', '10.0.0.7:8080') do |leadership|
    now = client.leader('rb.scheduler')
    check.call("leader election: leader() shows this replica's value and term",
               now && now.value == '10.0.0.7:8080' && now.term == leadership.term)
    check.call('leader election: another replica is not elected while this one leads',
               client.campaign('rb.scheduler', value: '10.0.0.8:8080').nil?)
    observer = client.observe('rb.scheduler')
    first = observer.first # Enumerable#first ends the stream after one change
    check.call('leader election: observe starts with the current leader',
               first.event == 'current' && first.leader.term == leadership.term)
    leadership.proclaim('10.0.0.7:9090')
    leadership.term
  end
  check.call('leader election: elected, with a term (fencing token)', term&.positive?)
  check.call('leader election: nobody leads after resign', client.leader('rb.scheduler').nil?)
end

# A big export takes 3 of 10 permits, small ones share the rest; 11 of 10
# raises InvalidArgument with the server's message.
def weighted_checks(client, check)
  client.lock('rb.exports', limit: 10, permits: 3, ttl_ms: 600) do |big|
    sleep 0.5 # near the end of the lease: the watchdog has renewed it by now
    check.call('weighted permits: a big job holds 3 of 10, one slot per permit, kept across renewals',
               big.permits == 3 && big.slots == [1, 2, 3])
    small = Array.new(7) { client.acquire('rb.exports', limit: 10, ttl_ms: 5000) }
    check.call('weighted permits: seven small jobs take the other slots, 4..10',
               small.map(&:slot).sort == (4..10).to_a && small.all? { |l| l.permits == 1 && l.slots == [l.slot] })
    check.call('weighted permits: inspect counts 10 permits in use',
               client.inspect_lock('rb.exports').permits_in_use == 10)
    busy = begin
      client.acquire('rb.exports', limit: 10)
      false
    rescue Tumbler::Busy
      true
    end
    check.call('weighted permits: an 11th permit is busy', busy)
    small.each(&:release)
  end
  refused = begin
    client.acquire('rb.exports', limit: 10, permits: 11)
    nil
  rescue Tumbler::InvalidArgument => e
    e.details
  end
  check.call("weighted permits: 11 of 10 raises InvalidArgument with the server's message",
             refused&.start_with?('permits'))
end

def all_checks(client)
  checks = []
  check = ->(what, ok) { checks << { what: what, ok: ok ? true : false } }
  args = ['invoice', 1001]
  check.call('unique jobs: first enqueue accepted', UniqueJobs.enqueue(client, 'RbMailer', args, 'jid-1', unique_for: 60_000))
  check.call('unique jobs: duplicate refused while pending', !UniqueJobs.enqueue(client, 'RbMailer', args, 'jid-2', unique_for: 60_000))
  begin
    UniqueJobs.perform(client, 'RbMailer', args, 'jid-1') { raise 'smtp down' }
  rescue RuntimeError
    nil
  end
  check.call('unique jobs (until success): a failed run keeps the digest locked',
             !UniqueJobs.enqueue(client, 'RbMailer', args, 'jid-3', unique_for: 60_000))
  UniqueJobs.perform(client, 'RbMailer', args, 'jid-1') { |_kind, _id| :sent }
  check.call('unique jobs (until success): success frees it',
             UniqueJobs.enqueue(client, 'RbMailer', args, 'jid-4', unique_for: 60_000))
  UniqueJobs.enqueue(client, 'RbIndexer', [9], 'jid-5', unique_for: 60_000)
  again = UniqueJobs.perform(client, 'RbIndexer', [9], 'jid-5', unique_until: :start) do
    UniqueJobs.enqueue(client, 'RbIndexer', [9], 'jid-6', unique_for: 60_000)
  end
  check.call('unique jobs (until start): the same job can be enqueued again while it runs', again)
  election_checks(client, check)
  weighted_checks(client, check)
  { checks: checks }
end

addr, namespace, cmd, *rest = ARGV
client = Tumbler::Client.new(addr, namespace: namespace)
out = case cmd
      when 'all' then all_checks(client)
      when 'enqueue'
        { enqueued: UniqueJobs.enqueue(client, rest[0], JSON.parse(rest[1]), rest[2], unique_for: Integer(rest[3])),
          lock: UniqueJobs.lock_name(rest[0], JSON.parse(rest[1])) }
      when 'perform'
        UniqueJobs.perform(client, rest[0], JSON.parse(rest[1]), rest[2]) { nil }
        { performed: true, lock: UniqueJobs.lock_name(rest[0], JSON.parse(rest[1])) }
      else raise "unknown command #{cmd}"
      end
puts JSON.generate(out)
