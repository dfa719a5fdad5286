package Tumbler::Lock;
use strict;
use warnings;
use Scalar::Util ();
use Time::HiRes ();
use Tumbler::Error;

our $VERSION = '0.1.0';

sub _now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

# A guard of $grant; its lease is counted by _count_lease.
sub _new {
    my ($class, $client, $name, $grant, $namespace) = @_;
    return bless {
        client    => $client,
        name      => $name,
        namespace => $namespace,
        grant     => $grant,
        ttl       => ($grant->{ttl_ms} // 0) / 1000,
        renewed   => undef,    # local clock: the start of the request that set the lease
        expires   => undef,    # local clock: the lease's end, never later than the server's
        pid       => $$,
        released  => 0,
        lost      => 0,
        lost_reason => undef,
    }, $class;
}

# The lease is counted from what the server answered, never from when the
# answer arrived (an answer can come late, or after retries). The answer
# carries no server clock, but a grant made during the call began no
# earlier than the call's $start, so its lease ends no earlier than
# $start + (expires_at_ms - acquired_at_ms). That holds for every grant
# when the client made the holder (or candidate) for this call
# ($made_here): an ALREADY_HELD answer is then an earlier try's grant
# whose answer was lost. Else it holds for an ACQUIRED answer, a new
# grant, unless a read request downgraded the holder's write grant (same
# lease). Any other grant may be from before the call, with a lease the
# answer does not date: it is renewed once, pinned to its token, and
# counted from that request's start (extend). So is a grant whose call
# took more than a quarter of its lease (it waited in the queue): counted
# from the call's start, little or none of it would be left.
sub _count_lease {
    my ($self, $start, $made_here) = @_;
    my $grant = $self->{grant};
    my $new_grant = ($grant->{status} // '') eq 'acquired' && ($grant->{mode} // '') ne 'read';
    my $lease_ms = defined $grant->{expires_at_ms} && defined $grant->{acquired_at_ms}
        ? $grant->{expires_at_ms} - $grant->{acquired_at_ms}
        : $grant->{ttl_ms} // 0;
    my $took_ms = (_now() - $start) * 1000;
    if ((!$made_here && !$new_grant) || $took_ms > $lease_ms / 4) {
        # The renewal's own deadline only: extend counts the lease anew
        # from its request's start, or the grant is lost.
        $self->{expires} = _now() + $self->{ttl};
        return $self->extend;
    }
    $self->_leased($start, $lease_ms);
    return $self;
}

# A lease of $lease_ms granted by a request that started at $start (local
# clock). The server's times are whole milliseconds (a grant made at
# 10.7 ms of its clock is stamped 10 and ends at 10 + ttl), hence 1 ms
# less.
sub _leased {
    my ($self, $start, $lease_ms) = @_;
    $self->{renewed} = $start;
    $self->{expires} = $start + ($lease_ms - 1) / 1000;
}

# Seconds left of the lease by the local count (0 once it has passed):
# the server's lease ends no earlier.
sub remaining {
    my $self = shift;
    my $left = $self->{expires} - _now();
    return $left > 0 ? $left : 0;
}

sub name          { $_[0]{name} }
sub namespace     { $_[0]{namespace} }
sub holder        { $_[0]{grant}{holder} }
sub fencing_token { $_[0]{grant}{fencing_token} }
sub slot          { $_[0]{grant}{slot} }
sub grant         { $_[0]{grant} }
# read or write for a grant of a read/write lock, undef for a plain lock's.
sub mode          { $_[0]{grant}{mode} }
# The permits the grant holds (1 unless acquired with permits => k), and
# its slots, one per permit, ascending (a list).
sub permits       { $_[0]{grant}{permits} }
sub slots         { @{ $_[0]{grant}{slots} } }
sub released      { $_[0]{released} }

# Why the lock is lost (undef while it is not): the lease ran out before a
# renewal, or the server answered that the grant is not held any more.
sub lost_reason   { $_[0]->lost ? $_[0]{lost_reason} : undef }

sub _lose {
    my ($self, $reason) = @_;
    return if $self->{lost};
    @$self{qw(lost lost_reason)} = (1, $reason);
}

sub _ns { defined $_[0]{namespace} ? (namespace => $_[0]{namespace}) : () }

# True once an Extend answered NOT_HELD or the lease ran out before a renewal.
sub lost {
    my $self = shift;
    return 0 if $self->{released};
    $self->_lose('lease ran out before a renewal') if !$self->{lost} && _now() >= $self->{expires};
    return $self->{lost};
}

sub check {
    my $self = shift;
    return $self unless $self->lost;
    die Tumbler::Error::LockLost->new(
        kind => 'lost', code => 'lost', method => 'check',
        message => "$self->{name}: lock lost (fencing token $self->{grant}{fencing_token}): $self->{lost_reason}",
        reason  => $self->{lost_reason},
    );
}

# extend(ttl_ms => ...): renews the lease, pinned to the fencing token.
# Dies Tumbler::Error::NotHeld (and the lock is lost from then on) when the
# server no longer has it.
sub extend {
    my ($self, %opts) = @_;
    $self->check;
    my $ttl_ms = $opts{ttl_ms} // $self->{grant}{ttl_ms};
    my $start = _now();
    # Retries of an unavailable server stop when the lease would end.
    my $left = $self->{expires} - $start;
    my $timeout = $opts{timeout} // $self->{client}{timeout};
    $timeout = $left if $left < $timeout;
    my $grant = eval { $self->_extend_call(ttl_ms => $ttl_ms, timeout => $timeout) };
    if (my $e = $@) {
        if (Scalar::Util::blessed($e) && $e->isa('Tumbler::Error')) {
            if ($e->kind eq 'not_held') {
                $self->_lose('not held any more (released by another, cleared or reaped)');
            } elsif ($e->kind eq 'unavailable' && _now() >= $self->{expires}) {
                $self->_lose('lease ran out before a renewal: ' . $e->message);
            }
        }
        die $e;
    }
    $self->{grant} = { %{ $self->{grant} }, %$grant };
    $self->{ttl}   = ($grant->{ttl_ms} // $ttl_ms) / 1000;
    $self->_leased($start, $self->{ttl} * 1000);   # Extend: ttl_ms from the server's now
    return $self;
}

# downgrade: a write grant becomes a read grant at once (the same fencing
# token, slot and lease; readers may then join). Dies
# Tumbler::Error::FailedPrecondition (a Tumbler::Error::InvalidArgument) on a plain
# lock, Tumbler::Error::LockLost when the grant is gone.
sub downgrade {
    my $self = shift;
    $self->check;
    my $grant = eval {
        $self->{client}->acquire($self->{name}, $self->_ns, holder => $self->holder, mode => 'read',
            ttl_ms => $self->{grant}{ttl_ms},
            (defined $self->{limit} ? (limit => $self->{limit}) : ()),
            (length($self->{grant}{kind} // '') ? (kind => $self->{grant}{kind}) : ()));
    };
    if (my $e = $@) {
        die $e unless Scalar::Util::blessed($e) && $e->isa('Tumbler::Error::NotAcquired');
        $self->_lose('not held any more (downgrade found another holder)');
        $self->check;
    }
    if ("$grant->{fencing_token}" ne "$self->{grant}{fencing_token}") {
        # A new grant, not ours: give it back.
        eval { $self->{client}->release($self->{name}, $self->_ns, holder => $self->holder,
            fencing_token => $grant->{fencing_token}); 1 };
        $self->_lose('not held any more (expired, released by another, cleared or reaped)');
        $self->check;
    }
    # The same grant and lease: the local count stands.
    $self->{grant} = { %{ $self->{grant} }, %$grant };
    return $self;
}

# heartbeat: extends the lease when a third of it has passed since the last
# renewal. Perl has no watchdog thread here: call it from the work loop, more
# often than a third of the TTL. Returns false when the lock is lost (it
# never dies for that; see check), true otherwise.
sub heartbeat {
    my ($self, %opts) = @_;
    return 0 if $self->{released} || $self->lost;
    return 1 if !$opts{force} && _now() - $self->{renewed} < $self->{ttl} / 3;
    eval { $self->extend; 1 } and return 1;
    my $e = $@;
    return 0 if $self->lost;
    # Unavailable with lease left: the next heartbeat tries again.
    return 1 if Scalar::Util::blessed($e) && $e->isa('Tumbler::Error') && $e->kind eq 'unavailable';
    die $e;
}

# release: true if this call released it, false if it was no longer held
# (lost, or released before).
sub release {
    my ($self, %opts) = @_;
    return 0 if $self->{released};
    $self->{released} = 1;
    return $self->_release_call(%opts);
}

# The Extend and Release of this grant, pinned to its fencing token
# (Tumbler::LockSet names its set instead).
sub _extend_call {
    my ($self, %opts) = @_;
    return $self->{client}->extend($self->{name}, $self->_ns, holder => $self->holder,
        fencing_token => $self->{grant}{fencing_token}, %opts);
}

sub _release_call {
    my ($self, %opts) = @_;
    return $self->{client}->release($self->{name}, $self->_ns, holder => $self->holder,
        fencing_token => $self->{grant}{fencing_token}, %opts);
}

sub DESTROY {
    my $self = shift;
    return if $self->{released} || $self->{pid} != $$ || !$self->{client};
    local ($@, $!, $?);
    eval { $self->release(timeout => 2); 1 };   # never dies here; a lost lock frees at its lease end
}

1;

__END__

=head1 NAME

Tumbler::Lock - a tumbler lock held for a scope

=head1 SYNOPSIS

    {
        my $lock = $client->lock('reports', ttl_ms => 30_000, wait_ms => 5_000);
        for my $row (@rows) {
            $lock->heartbeat or die "lost the lock";
            write_row($row, fence => $lock->fencing_token);
        }
    }   # released here

=head1 DESCRIPTION

Returned by C<< Tumbler::Client->lock >>. Released when the object goes out
of scope (C<DESTROY>, which never dies, and does nothing in a forked child).
C<heartbeat> extends the lease when a third of it has passed since the last
renewal: there is no background thread, so the caller calls it from its
loop. C<lost> is true once an extend answered NOT_HELD or the lease passed
without a renewal; C<check> dies with a C<Tumbler::Error::LockLost> then,
and C<lost_reason> says which of the two it was.

The lease is counted from the start of the request that was granted it
(for a retried acquire, the first try's start), never from when the
answer arrived, so the local count (C<remaining>, seconds left) never
outlasts the server's lease. A grant a caller-given holder already had
is renewed once by C<lock>, and counted from that renewal's start.

=cut
