#!/usr/bin/env ruby
# frozen_string_literal: true

# Ruby's steps of the cross-language conformance scenario (clients/conformance),
# run with the installed tumbler-client gem.
# usage: conformance_steps.rb ADDR NAMESPACE STEP ARGS...
# Prints JSON lines: events ({"event": ...}) while it runs, its result last.
require 'json'
require 'timeout'
require 'tumbler'

def emit(obj)
  puts JSON.generate(obj)
  $stdout.flush
end

def now_ms = (Time.now.to_f * 1000).to_i
def mono = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def grant_json(lock)
  { holder: lock.holder, token: lock.fencing_token.to_s, slot: lock.slot, acquired_at_ms: lock.grant.acquired_at_ms }
end

def queue_names(client, name) = client.queue(name).requests.map(&:holder)

def leadership_json(leader)
  return nil if leader.nil?

  { candidate: leader.candidate, term: leader.term.to_s, value: leader.value, elected_at_ms: leader.elected_at_ms,
    expires_at_ms: leader.expires_at_ms }
end

module Steps
  module_function

  def hold(c, name, holder, limit)
    { status: 'ACQUIRED', **grant_json(c.acquire(name, holder: holder, limit: Integer(limit), ttl_ms: 60_000)) }
  rescue Tumbler::NotAcquired => e
    { status: e.busy? ? 'BUSY' : 'TIMEOUT', holders: e.response.holders }
  end

  # A try-once acquire kept (60 s lease): ACQUIRED with the block's fields, BUSY, or the error.
  def try_once(c, name, holder, **options)
    lock = c.acquire(name, holder: holder, ttl_ms: 60_000, **options)
    { status: 'ACQUIRED', **grant_json(lock), **yield(lock) }
  rescue Tumbler::NotAcquired => e
    { status: e.busy? ? 'BUSY' : 'TIMEOUT', holders: e.response.holders }
  rescue Tumbler::Error => e
    { status: 'ERROR', code: e.code, typed: e.class.name, message: e.details }
  end

  # Try once as read, write or plain; keep the grant (60 s lease).
  def rw_hold(c, name, holder, mode)
    try_once(c, name, holder, mode: mode == 'plain' ? nil : mode) { |lock| { mode: lock.mode } }
  end

  def weights(lock) = { permits: lock.permits, slots: lock.slots }

  # Try once for PERMITS of LIMIT; keep the grant (60 s lease).
  def weighted_hold(c, name, holder, limit, permits)
    try_once(c, name, holder, limit: Integer(limit), permits: Integer(permits)) { |lock| weights(lock) }
  end

  # Wait for PERMITS of LIMIT, extend, hold a while, release.
  def weighted_wait(c, name, holder, limit, permits, wait_ms, hold_ms)
    c.lock(name, holder: holder, wait_ms: Integer(wait_ms), ttl_ms: 60_000, limit: Integer(limit),
                 permits: Integer(permits)) do |lock|
      out = { **grant_json(lock), **weights(lock) }
      lock.extend_lease
      out[:extended] = weights(lock)
      sleep Integer(hold_ms) / 1000.0
      out.merge(released_at_ms: now_ms)
    end
  end

  def set_json(set)
    { status: 'ACQUIRED', holder: set.holder,
      grants: set.grants.map { |g| { name: g.name, token: g.fencing_token.to_s, slot: g.slot } } }
  end

  # BUSY, TIMEOUT or the error, as try_once reports them.
  def not_granted(err)
    case err
    when Tumbler::NotAcquired then { status: err.busy? ? 'BUSY' : 'TIMEOUT' }
    else { status: 'ERROR', code: err.code, typed: err.class.name, message: err.details }
    end
  end

  # Try once for the set NAMES; keep it (60 s lease).
  def multi_hold(c, holder, names)
    set_json(c.acquire_all(names.split(','), holder: holder, ttl_ms: 60_000))
  rescue Tumbler::Error => e
    not_granted(e)
  end

  # Wait for the set, extend it once, hold a while, release it.
  def multi_wait(c, holder, names, wait_ms, hold_ms)
    c.lock_all(names.split(','), holder: holder, wait_ms: Integer(wait_ms), ttl_ms: 60_000) do |set|
      out = set_json(set)
      out[:extended] = begin
        set.extend_lease
        true
      rescue Tumbler::LockLost
        false
      end
      sleep Integer(hold_ms) / 1000.0
      out.merge(released_at_ms: now_ms)
    end
  rescue Tumbler::Error => e
    not_granted(e)
  end

  def multi_release(c, holder, names)
    { released: c.release_all(names.split(','), holder: holder) }
  end

  # S1 taken and released, S2 taken, S1's release again (the stale one);
  # on a line from stdin, S2 released.
  def multi_stale(c, holder, names)
    first = c.acquire_all(names.split(','), holder: holder, ttl_ms: 60_000)
    first_released = first.release
    second = c.acquire_all(names.split(','), holder: holder, ttl_ms: 60_000)
    emit(event: 'stale', first: set_json(first), second: set_json(second), first_released: first_released,
         stale_released: first.release)
    $stdin.gets
    { released: second.release }
  end

  # Wait for one lock; a refusal closing a cycle is caught as Tumbler::Deadlock.
  def deadlock_wait(c, name, holder, wait_ms)
    lock = c.acquire(name, holder: holder, wait_ms: Integer(wait_ms), ttl_ms: 60_000)
    lock.release
    { status: 'ACQUIRED', token: lock.fencing_token.to_s }
  rescue Tumbler::Deadlock => e
    { status: 'DEADLOCK', typed: e.class.name, code: e.code, message: e.details }
  rescue Tumbler::Error => e
    not_granted(e)
  end

  # Wait in a mode, hold a while, release.
  def rw_wait(c, name, holder, mode, wait_ms, hold_ms)
    c.lock(name, holder: holder, wait_ms: Integer(wait_ms), ttl_ms: 60_000, mode: mode) do |lock|
      out = { **grant_json(lock), mode: lock.mode }
      sleep Integer(hold_ms) / 1000.0
      out.merge(released_at_ms: now_ms)
    end
  end

  def release(c, name, holder)
    resp = c.stub.release(Tumbler::V1::ReleaseRequest.new(namespace: c.namespace, name: name, holder: holder))
    { released: resp.status == :RELEASE_STATUS_RELEASED }
  end

  def wait(c, name, holder, wait_ms, hold_ms)
    c.lock(name, holder: holder, wait_ms: Integer(wait_ms), ttl_ms: 60_000) do |lock|
      out = grant_json(lock)
      sleep Integer(hold_ms) / 1000.0
      out.merge(released_at_ms: now_ms)
    end
  end

  def scoped(c, name)
    out = c.lock(name, ttl_ms: 2000) do |lock|
      o = grant_json(lock)
      before = lock.grant.expires_at_ms
      sleep 0.05
      lock.extend_lease(30_000)
      o.merge(extended: lock.grant.expires_at_ms > before)
    end
    out.merge(holders_after: c.inspect_lock(name).holders.size)
  end

  def inspect(c, name)
    info = c.inspect_lock(name)
    { limit: info.limit, waiters: info.waiters,
      holders: info.holders.map { |h| { holder: h.grant.holder, token: h.grant.fencing_token.to_s, slot: h.grant.slot } },
      queue: queue_names(c, name) }
  end

  def invalid(c) # bad input: queue_ttl_ms below 100
    c.acquire('conformance-invalid', wait_ms: 10, queue_ttl_ms: 5)
    { field: 'queue_ttl_ms', code: 'OK' }
  rescue Tumbler::InvalidArgument => e
    { field: 'queue_ttl_ms', code: 'INVALID_ARGUMENT', message: e.details, typed: e.class.name }
  end

  def keep(c, name, ttl_ms, work_ms) # a lease shorter than the work: the watchdog keeps it
    out = c.lock(name, holder: 'rb-keeper', ttl_ms: Integer(ttl_ms)) do |lock|
      emit({ event: 'held', **grant_json(lock) })
      start = now_ms
      sleep Integer(work_ms) / 1000.0
      { body_start_ms: start, body_end_ms: now_ms, token: lock.fencing_token.to_s, lost: lock.lost?,
        token_inside: c.inspect_lock(name).holders.first&.grant&.fencing_token.to_s }
    end
    # Its own grant only: the driver's prober may take the freed lock at once.
    out.merge(holders_after: c.inspect_lock(name).holders.count { |h| h.grant.holder == 'rb-keeper' })
  end

  def crash(c, name, ttl_ms) # hold with the helper, then get killed by the driver
    c.lock(name, holder: 'rb-crasher', ttl_ms: Integer(ttl_ms)) do |lock|
      emit({ event: 'held', **grant_json(lock) })
      sleep 60
    end
    { survived: true }
  end

  def lost(c, name, ttl_ms) # the driver takes the grant away: LockLost is raised inside the block
    out = { signalled: false }
    c.lock(name, holder: 'rb-loser', ttl_ms: Integer(ttl_ms)) do |lock|
      emit({ event: 'held', **grant_json(lock) })
      begin
        sleep 10
      rescue Tumbler::LockLost => e
        out.merge!(signalled: true, signal_at_ms: now_ms, reason: e.reason)
        raise
      end
    end
    out
  rescue Tumbler::LockLost => e
    out.merge(raised: e.class.name)
  end

  def cancel(c, name, after_ms) # Timeout.timeout around a waiting acquire: no ghost waiter
    holder = 'rb-canceller'
    t0 = mono + (Integer(after_ms) / 1000.0) # when the timeout fires
    waiter = Thread.new do
      Timeout.timeout(Integer(after_ms) / 1000.0) { c.acquire(name, holder: holder, wait_ms: 20_000, ttl_ms: 10_000) }
      'acquired'
    rescue Timeout::Error => e
      e.class.name
    end
    sleep((Integer(after_ms) - 100) / 1000.0)
    queued = queue_names(c, name).include?(holder)
    error = waiter.value
    out = { error: error, cancel_ms: ((mono - t0) * 1000).round, queued_before: queued }
    loop do # poll the queue (up to 2 s) until the request has left it
      out[:queue_after] = queue_names(c, name)
      out[:gone_ms] = ((mono - t0) * 1000).round
      return out if !out[:queue_after].include?(holder) || out[:gone_ms] > 2000

      sleep 0.01
    end
  end

  def campaign(c, name, candidate, value, ttl_ms, wait_ms) # campaign, then act on commands from stdin
    held = c.campaign(name, value: value, candidate: candidate, ttl_ms: Integer(ttl_ms), wait_ms: Integer(wait_ms))
    return { elected: false } unless held

    emit({ event: 'elected', elected: true, at_ms: now_ms, **leadership_json(held.leader) })
    $stdin.each_line do |line|
      cmd, arg = line.strip.split(' ', 2)
      case cmd
      when 'proclaim'
        begin
          held.proclaim(arg.to_s)
          emit({ event: 'proclaim', status: 'PROCLAIMED', value: held.value, lost: held.lost? })
        rescue Tumbler::NotLeader => e
          emit({ event: 'proclaim', status: 'NOT_LEADER', typed: e.class.name, lost: held.lost? })
        end
      when 'resign'
        first = held.resign
        emit({ event: 'resign', first: first, second: held.resign, lost: held.lost? })
      when 'lost'
        until_at = mono + (Integer(arg) / 1000.0)
        sleep 0.01 until held.lost? || mono >= until_at
        emit({ event: 'lost', lost: held.lost?, reason: held.lost_reason, at_ms: now_ms })
      when 'exit'
        break
      end
    end
    held.resign
    { done: true, term: held.term.to_s }
  end

  def leader(c, name)
    { leader: leadership_json(c.leader(name)) }
  end

  def observe(c, name, stop_candidate, timeout_ms) # the leader changes until stop_candidate is elected
    observer = c.observe(name, timeout: Integer(timeout_ms) / 1000.0)
    changes = []
    observer.each do |change|
      seen = { kind: change.event, leader: leadership_json(change.leader), ended_term: change.ended_term.to_s }
      changes << seen
      emit({ event: 'change', **seen })
      observer.cancel if change.event == 'elected' && change.leader&.candidate == stop_candidate
    end
    { cancelled: observer.cancelled?, changes: changes }
  end

  def restart(c, name, holder, wait_ms) # wait through a server restart (retries on UNAVAILABLE)
    started = mono
    lock = c.acquire(name, holder: holder, wait_ms: Integer(wait_ms), ttl_ms: 30_000)
    out = { status: 'ACQUIRED', **grant_json(lock), elapsed_ms: ((mono - started) * 1000).round }
    lock.release
    out
  end
end

# The token is sent; none, or another namespace, is Tumbler::PermissionDenied.
def auth(addr, namespace, token)
  attempt = lambda do |ns, tok|
    Tumbler::Client.new(addr, namespace: ns, token: tok).acquire('auth-ruby', ttl_ms: 5000).release
    'ACQUIRED'
  rescue Tumbler::Error => e
    e.class.name
  end
  { with_token: attempt.call(namespace, token), no_token: attempt.call(namespace, nil),
    other_namespace: attempt.call('elsewhere', token) }
end

addr, namespace, step, *args = ARGV
client = Tumbler::Client.new(addr, namespace: namespace)
emit(case step
     when 'invalid' then Steps.invalid(client)
     when 'auth' then auth(addr, namespace, *args)
     else Steps.public_send(step, client, *args)
     end)
