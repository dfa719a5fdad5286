#!/usr/bin/env perl
# Perl's steps of the cross-language conformance scenario (clients/conformance),
# run with the installed Tumbler-Client distribution (PERL5LIB points at it).
# usage: conformance_steps.pl ADDR NAMESPACE STEP ARGS...
# Prints JSON lines: events ({"event": ...}) while it runs, its result last.
use strict;
use warnings;
use IO::Select ();
use JSON::PP ();
use POSIX ();
use Scalar::Util qw(blessed);
use Time::HiRes ();
use Tumbler::Client;

my $JSON = JSON::PP->new->canonical;
$| = 1;

sub emit    { print $JSON->encode($_[0]), "\n" }
sub now_ms  { int(Time::HiRes::time() * 1000) }
sub mono    { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }
sub bool    { $_[0] ? JSON::PP::true : JSON::PP::false }
sub is_a    { my ($e, $class) = @_; blessed $e && $e->isa($class) }

sub grant_json {
    my $g = shift;
    $g = $g->grant if blessed $g;
    return (holder => $g->{holder}, token => "$g->{fencing_token}", slot => 0 + ($g->{slot} // 0),
        acquired_at_ms => 0 + ($g->{acquired_at_ms} // 0));
}

sub queue_names { my ($c, $name) = @_; [ map { $_->{holder} } @{ $c->queue($name)->{requests} // [] } ] }

# Holds the guard for $ms, calling heartbeat from the loop (Perl has no
# watchdog thread: this is how a Perl program keeps a lease shorter than its
# work). Returns false as soon as the lock is lost.
sub work_for {
    my ($lock, $ms) = @_;
    my $until = mono() + $ms / 1000;
    while (mono() < $until) {
        return 0 unless $lock->heartbeat;
        Time::HiRes::sleep(0.02);
    }
    return 1;
}

my %steps;

$steps{hold} = sub {
    my ($c, $name, $holder, $limit) = @_;
    my $g = eval { $c->acquire($name, holder => $holder, limit => $limit, ttl_ms => 60_000) };
    return { status => 'ACQUIRED', grant_json($g) } if $g;
    my $e = $@;
    die $e unless is_a($e, 'Tumbler::Error::NotAcquired');
    return { status => $e->kind eq 'busy' ? 'BUSY' : 'TIMEOUT', holders => 0 + ($e->holders // 0) };
};

# A try-once acquire kept (60 s lease): ACQUIRED with $out->($grant)'s
# fields, BUSY, or the error.
sub try_once {
    my ($c, $name, $holder, $out, %opts) = @_;
    my $g = eval { $c->acquire($name, holder => $holder, ttl_ms => 60_000, %opts) };
    return { status => 'ACQUIRED', grant_json($g), $out->($g) } if $g;
    my $e = $@;
    die $e unless is_a($e, 'Tumbler::Error');
    return { status => $e->kind eq 'busy' ? 'BUSY' : 'TIMEOUT', holders => 0 + ($e->holders // 0) }
        if is_a($e, 'Tumbler::Error::NotAcquired');
    return { status => 'ERROR', code => $e->code, typed => ref $e, message => $e->message };
}

# Try once as read, write or plain; keep the grant (60 s lease).
$steps{rw_hold} = sub {
    my ($c, $name, $holder, $mode) = @_;
    return try_once($c, $name, $holder, sub { (mode => $_[0]{mode}) }, ($mode eq 'plain' ? () : (mode => $mode)));
};

sub weights { my $g = shift; (permits => 0 + $g->{permits}, slots => [ map { 0 + $_ } @{ $g->{slots} } ]) }

# Try once for PERMITS of LIMIT; keep the grant (60 s lease).
$steps{weighted_hold} = sub {
    my ($c, $name, $holder, $limit, $permits) = @_;
    return try_once($c, $name, $holder, \&weights, limit => $limit, permits => $permits);
};

# Wait for PERMITS of LIMIT, extend, hold a while, release.
$steps{weighted_wait} = sub {
    my ($c, $name, $holder, $limit, $permits, $wait_ms, $hold_ms) = @_;
    my $lock = $c->lock($name, holder => $holder, limit => $limit, permits => $permits, wait_ms => $wait_ms,
        ttl_ms => 60_000);
    my %out = (grant_json($lock), weights($lock->grant));
    $lock->extend;
    $out{extended} = { weights($lock->grant) };
    Time::HiRes::sleep($hold_ms / 1000);
    $out{released_at_ms} = now_ms();
    undef $lock;   # the guard releases here
    return \%out;
};

sub set_json {
    my ($holder, @grants) = @_;
    return (status => 'ACQUIRED', holder => $holder,
        grants => [ map { { name => $_->{name}, token => "$_->{fencing_token}", slot => 0 + $_->{slot} } } @grants ]);
}

# BUSY, TIMEOUT or the error, as try_once reports them (anything else dies).
sub not_granted {
    my $e = shift;
    die $e unless is_a($e, 'Tumbler::Error');
    return { status => $e->kind eq 'busy' ? 'BUSY' : 'TIMEOUT' } if is_a($e, 'Tumbler::Error::NotAcquired');
    return { status => 'ERROR', code => $e->code, typed => ref $e, message => $e->message };
}

# Try once for the set NAMES; keep it (60 s lease).
$steps{multi_hold} = sub {
    my ($c, $holder, $names) = @_;
    my $set = eval { $c->acquire_all([ split /,/, $names ], holder => $holder, ttl_ms => 60_000) };
    return $set ? { set_json($set->{holder}, @{ $set->{grants} }) } : not_granted($@);
};

# Wait for the set, extend it once, hold a while, release it (the guard).
$steps{multi_wait} = sub {
    my ($c, $holder, $names, $wait_ms, $hold_ms) = @_;
    my $set = eval { $c->lock_all([ split /,/, $names ], holder => $holder, wait_ms => $wait_ms, ttl_ms => 60_000) }
        or return not_granted($@);
    my %out = set_json($set->holder, $set->grants);
    $out{extended} = bool(eval { $set->extend; 1 });
    Time::HiRes::sleep($hold_ms / 1000);
    $out{released_at_ms} = now_ms();
    undef $set;   # the guard releases the set here
    return \%out;
};

$steps{multi_release} = sub {
    my ($c, $holder, $names) = @_;
    return { released => bool($c->release_all([ split /,/, $names ], holder => $holder)) };
};

# S1 taken and released, S2 taken, then S1's release again: the guard would
# refuse a second release itself, so release_all with S1's tokens (the stale
# one); on a line from stdin, S2 released.
$steps{multi_stale} = sub {
    my ($c, $holder, $names) = @_;
    my @names = split /,/, $names;
    my $first = $c->lock_all(\@names, holder => $holder, ttl_ms => 60_000);
    my $first_released = $first->release;
    my $second = $c->lock_all(\@names, holder => $holder, ttl_ms => 60_000);
    my $stale = $c->release_all(\@names, holder => $holder, fencing_tokens => [ $first->fencing_tokens ]);
    emit({ event => 'stale', first => { set_json($first->holder, $first->grants) },
           second => { set_json($second->holder, $second->grants) }, first_released => bool($first_released),
           stale_released => bool($stale) });
    my $line = <STDIN>;
    return { released => bool($second->release) };
};

# Wait for one lock; a refusal closing a cycle is caught as Tumbler::Error::Deadlock.
$steps{deadlock_wait} = sub {
    my ($c, $name, $holder, $wait_ms) = @_;
    my $g = eval { $c->acquire($name, holder => $holder, wait_ms => $wait_ms, ttl_ms => 60_000) };
    if ($g) {
        $c->release($name, holder => $holder, fencing_token => $g->{fencing_token});
        return { status => 'ACQUIRED', token => "$g->{fencing_token}" };
    }
    my $e = $@;
    return { status => 'DEADLOCK', typed => ref $e, code => $e->code, message => $e->message }
        if is_a($e, 'Tumbler::Error::Deadlock');
    return not_granted($e);
};

# Wait in a mode, hold a while, release.
$steps{rw_wait} = sub {
    my ($c, $name, $holder, $mode, $wait_ms, $hold_ms) = @_;
    my $lock = $c->lock($name, holder => $holder, wait_ms => $wait_ms, ttl_ms => 60_000, mode => $mode);
    my %out = (grant_json($lock), mode => $lock->mode);
    Time::HiRes::sleep($hold_ms / 1000);
    $out{released_at_ms} = now_ms();
    undef $lock;   # the guard releases here
    return \%out;
};

$steps{release} = sub {
    my ($c, $name, $holder) = @_;
    return { released => bool($c->release($name, holder => $holder)) };
};

$steps{wait} = sub {
    my ($c, $name, $holder, $wait_ms, $hold_ms) = @_;
    my $lock = $c->lock($name, holder => $holder, wait_ms => $wait_ms, ttl_ms => 60_000);
    my %out = grant_json($lock);
    Time::HiRes::sleep($hold_ms / 1000);
    $out{released_at_ms} = now_ms();
    undef $lock;   # the guard releases here
    return \%out;
};

$steps{scoped} = sub {
    my ($c, $name) = @_;
    my %out;
    {
        my $lock = $c->lock($name, ttl_ms => 2000);
        %out = grant_json($lock);
        my $before = $lock->grant->{expires_at_ms};
        Time::HiRes::sleep(0.05);
        $lock->extend(ttl_ms => 30_000);
        $out{extended} = bool($lock->grant->{expires_at_ms} > $before);
    }   # released on leaving the scope
    $out{holders_after} = scalar @{ $c->inspect($name)->{holders} // [] };
    return \%out;
};

$steps{inspect} = sub {
    my ($c, $name) = @_;
    my $info = $c->inspect($name);
    return {
        limit   => 0 + ($info->{limit} // 0),
        waiters => 0 + ($info->{waiters} // 0),
        holders => [ map { { holder => $_->{grant}{holder}, token => "$_->{grant}{fencing_token}",
                             slot => 0 + $_->{grant}{slot} } } @{ $info->{holders} // [] } ],
        queue   => queue_names($c, $name),
    };
};

$steps{invalid} = sub {   # bad input: ttl_ms 0
    my ($c) = @_;
    my $g = eval { $c->acquire('conformance-invalid', ttl_ms => 0) };
    return { field => 'ttl_ms', code => 'OK' } if $g;
    my $e = $@;
    die $e unless is_a($e, 'Tumbler::Error::InvalidArgument');
    return { field => 'ttl_ms', code => $e->code, message => $e->message, typed => ref $e };
};

$steps{keep} = sub {   # a lease shorter than the work: heartbeat from the loop keeps it
    my ($c, $name, $ttl_ms, $work_ms) = @_;
    my %out;
    {
        my $lock = $c->lock($name, holder => 'pl-keeper', ttl_ms => $ttl_ms);
        emit({ event => 'held', grant_json($lock) });
        my $start = now_ms();
        work_for($lock, $work_ms);
        my ($first) = @{ $c->inspect($name)->{holders} // [] };
        %out = (body_start_ms => $start, body_end_ms => now_ms(), token => $lock->fencing_token,
            lost => bool($lock->lost), token_inside => $first ? "$first->{grant}{fencing_token}" : undef);
    }
    # Its own grant only: the driver's prober may take the freed lock at once.
    $out{holders_after} = scalar grep { $_->{grant}{holder} eq 'pl-keeper' } @{ $c->inspect($name)->{holders} // [] };
    return \%out;
};

$steps{crash} = sub {   # hold, then get killed by the driver
    my ($c, $name, $ttl_ms) = @_;
    my $lock = $c->lock($name, holder => 'pl-crasher', ttl_ms => $ttl_ms);
    emit({ event => 'held', grant_json($lock) });
    work_for($lock, 60_000);
    return { survived => JSON::PP::true };
};

$steps{lost} = sub {   # the grant is taken away: heartbeat says so, check dies LockLost
    my ($c, $name, $ttl_ms) = @_;
    my %out = (signalled => JSON::PP::false);
    eval {
        my $lock = $c->lock($name, holder => 'pl-loser', ttl_ms => $ttl_ms);
        emit({ event => 'held', grant_json($lock) });
        unless (work_for($lock, 10_000)) {
            @out{qw(signalled signal_at_ms reason)} = (JSON::PP::true, now_ms(), $lock->lost_reason);
        }
        $lock->check;
        1;
    } or do {
        my $e = $@;
        die $e unless is_a($e, 'Tumbler::Error::LockLost');
        $out{raised} = ref $e;
    };
    return \%out;
};

$steps{cancel} = sub {   # a waiting acquire stopped by a signal handler (alarm): no ghost waiter
    my ($c, $name, $after_ms) = @_;
    my $holder = 'pl-canceller';
    # A child looks at the queue while the parent waits (Perl has no threads here).
    pipe my $r, my $w or die "pipe: $!";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        close $r;
        Time::HiRes::sleep(($after_ms - 100) / 1000);
        my $peek = Tumbler::Client->new(endpoint => $c->endpoint, namespace => $c->namespace);
        my $in = grep { $_ eq $holder } @{ queue_names($peek, $name) };
        syswrite $w, $in ? "1" : "0";
        POSIX::_exit(0);
    }
    close $w;
    my $t0 = mono() + $after_ms / 1000;   # when the alarm fires
    my $error = eval {
        local $SIG{ALRM} = sub { die "SIGALRM\n" };
        Time::HiRes::alarm($after_ms / 1000);
        $c->acquire($name, holder => $holder, wait_ms => 20_000, ttl_ms => 10_000);
        Time::HiRes::alarm(0);
        'acquired';
    } // do { Time::HiRes::alarm(0); my $e = $@; chomp $e; $e };
    my %out = (error => "$error", cancel_ms => int((mono() - $t0) * 1000 + 0.5));
    waitpid $pid, 0;
    sysread $r, my $seen, 1;
    $out{queued_before} = bool(($seen // '') eq '1');
    while (1) {   # poll the queue (up to 2 s) until the request has left it
        $out{queue_after} = queue_names($c, $name);
        $out{gone_ms} = int((mono() - $t0) * 1000 + 0.5);
        return \%out if !grep({ $_ eq $holder } @{ $out{queue_after} }) || $out{gone_ms} > 2000;
        Time::HiRes::sleep(0.01);
    }
};

$steps{restart} = sub {   # wait through a server restart (retries on unavailable, same holder)
    my ($c, $name, $holder, $wait_ms) = @_;
    my $started = mono();
    my $lock = $c->lock($name, holder => $holder, wait_ms => $wait_ms, ttl_ms => 30_000);
    my %out = (status => 'ACQUIRED', grant_json($lock), elapsed_ms => int((mono() - $started) * 1000));
    $lock->release;
    return \%out;
};

sub leadership_json {
    my $l = shift;
    return undef unless $l;
    return { candidate => $l->{candidate}, term => "$l->{term}", value => $l->{value},
        elected_at_ms => 0 + $l->{elected_at_ms}, expires_at_ms => 0 + $l->{expires_at_ms} };
}

# Campaign, then act on commands from stdin; between them, heartbeat keeps
# the lease (Perl has no watchdog thread: the loop calls it).
$steps{campaign} = sub {
    my ($c, $name, $candidate, $value, $ttl_ms, $wait_ms) = @_;
    my $held = $c->campaign($name, candidate => $candidate, value => $value, ttl_ms => $ttl_ms, wait_ms => $wait_ms);
    return { elected => JSON::PP::false } unless $held;
    emit({ event => 'elected', elected => JSON::PP::true, at_ms => now_ms(), %{ leadership_json($held->leader) } });
    my $in = IO::Select->new(\*STDIN);
    my $line = '';
    while (1) {
        $held->heartbeat;
        next unless $in->can_read(0.02);
        my $n = sysread STDIN, my $chunk, 4096;
        last unless $n;
        $line .= $chunk;
        while ($line =~ s/^([^\n]*)\n//) {
            my ($cmd, $arg) = split / /, $1, 2;
            $cmd //= '';
            if ($cmd eq 'proclaim') {
                if (eval { $held->proclaim($arg // ''); 1 }) {
                    emit({ event => 'proclaim', status => 'PROCLAIMED', value => $held->value,
                        lost => bool($held->lost) });
                } else {
                    my $e = $@;
                    die $e unless is_a($e, 'Tumbler::Error::NotLeader');
                    emit({ event => 'proclaim', status => 'NOT_LEADER', typed => ref $e, lost => bool($held->lost) });
                }
            } elsif ($cmd eq 'resign') {
                my $first = $held->resign;
                emit({ event => 'resign', first => bool($first), second => bool($held->resign),
                    lost => bool($held->lost) });
            } elsif ($cmd eq 'lost') {
                my $until = mono() + $arg / 1000;
                while (mono() < $until && $held->heartbeat) { Time::HiRes::sleep(0.01) }
                emit({ event => 'lost', lost => bool($held->lost), reason => $held->lost_reason, at_ms => now_ms() });
            } elsif ($cmd eq 'exit') {
                $held->resign;
                return { done => JSON::PP::true, term => "" . $held->term };
            }
        }
    }
    $held->resign;
    return { done => JSON::PP::true, term => "" . $held->term };
};

$steps{leader} = sub {
    my ($c, $name) = @_;
    return { leader => leadership_json($c->leader($name)) };
};

$steps{observe} = sub {   # the leader changes until stop_candidate is elected
    my ($c, $name, $stop_candidate, $timeout_ms) = @_;
    my (@changes, $cancelled);
    $c->observe($name, sub {
        my $change = shift;
        my %seen = (kind => $change->{event}, leader => leadership_json($change->{leader}),
            ended_term => "$change->{ended_term}");
        push @changes, \%seen;
        emit({ event => 'change', %seen });
        $cancelled = $change->{event} eq 'elected' && $change->{leader}{candidate} eq $stop_candidate;
        return !$cancelled;
    }, timeout => $timeout_ms / 1000);
    return { cancelled => bool($cancelled), changes => \@changes };
};

# The token is sent; none, or another namespace, is Tumbler::Error::Denied.
sub auth {
    my ($addr, $namespace, $token) = @_;
    my $attempt = sub {
        my ($ns, $tok) = @_;
        my $c = Tumbler::Client->new(endpoint => $addr, namespace => $ns, (defined $tok ? (token => $tok) : ()));
        my $ok = eval { $c->lock('auth-perl', ttl_ms => 5000)->release; 1 };
        return $ok ? 'ACQUIRED' : (ref $@ || "$@");
    };
    return { with_token => $attempt->($namespace, $token), no_token => $attempt->($namespace, undef),
        other_namespace => $attempt->('elsewhere', $token) };
}

my ($addr, $namespace, $step, @args) = @ARGV;
my $out;
if ($step eq 'auth') {
    $out = auth($addr, $namespace, @args);
} else {
    my $code = $steps{$step} or die "unknown step $step\n";
    $out = $code->(Tumbler::Client->new(endpoint => $addr, namespace => $namespace), @args);
}
emit($out);
