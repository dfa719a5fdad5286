package IPC::ConcurrencyLimit::Lock::Tumbler;
use strict;
use warnings;
use Carp ();
use Scalar::Util ();
use Tumbler::Client;
use Tumbler::Error;

our $VERSION = '0.1.0';

# IPC::ConcurrencyLimit's lock classes derive from its tiny base class; do so
# when it is installed, so that isa() checks hold, and work without it.
our @ISA;
push @ISA, 'IPC::ConcurrencyLimit::Lock'
    if eval { require IPC::ConcurrencyLimit::Lock; 1 };

my %DEFAULT_TTL_MS = (ttl_ms => 60_000);

# The options with their defaults, or a croak naming the one that is wrong.
sub _check {
    my $opt = shift;
    my %o = (%DEFAULT_TTL_MS, wait_ms => 0, %$opt);

    my $max_procs = $o{max_procs};
    Carp::croak("max_procs must be a whole number of at least 1 (the number of slots), not "
            . (defined $max_procs ? "'$max_procs'" : 'undef'))
        unless defined $max_procs && $max_procs =~ /^\d+$/ && $max_procs >= 1;
    my $key_name = $o{key_name};
    Carp::croak("key_name is required: the lock's name, shared by every process that counts against max_procs")
        unless defined $key_name && length $key_name;
    my $ttl_ms = $o{ttl_ms};
    Carp::croak("ttl_ms must be a whole number of milliseconds of at least 1, not '$ttl_ms'")
        unless defined $ttl_ms && $ttl_ms =~ /^\d+$/ && $ttl_ms >= 1;
    my $wait_ms = $o{wait_ms} // 0;
    Carp::croak("wait_ms must be a whole number of milliseconds, not '$wait_ms'")
        unless $wait_ms =~ /^\d+$/;

    Carp::croak('client must be a Tumbler::Client')
        if defined $o{client} && !(Scalar::Util::blessed($o{client}) && $o{client}->isa('Tumbler::Client'));
    return \%o;
}

# new(\%opts): IPC::ConcurrencyLimit's get_lock calls this with its options
# (max_procs, key_name, proc_info, and whatever else the user passed). One
# try for a slot: the lock object, or undef when all max_procs slots are
# taken. Bad options croak; a server that cannot be reached dies with a
# Tumbler::Error::Unavailable (that is not "no free slot").
sub new {
    my ($class, $opt) = @_;
    Carp::croak('IPC::ConcurrencyLimit::Lock::Tumbler->new needs a hash of options')
        unless ref $opt eq 'HASH';
    my %o = %{ _check($opt) };
    my ($max_procs, $key_name, $ttl_ms, $wait_ms) = @o{qw(max_procs key_name ttl_ms wait_ms)};

    my $client = $o{client};
    unless (defined $client) {
        $client = Tumbler::Client->new(
            endpoint => $o{endpoint} // $ENV{TUMBLER_ENDPOINT} // 'http://127.0.0.1:50051',
            (defined($o{token} // $ENV{TUMBLER_TOKEN}) ? (token => $o{token} // $ENV{TUMBLER_TOKEN}) : ()),
            (defined $o{namespace} ? (namespace => $o{namespace}) : ()),
            (defined $o{timeout} ? (timeout => $o{timeout}) : ()),
        );
    }

    my $proc_info = $o{proc_info} // '';
    my %metadata = (%{ $o{metadata} // {} }, proc_info => "$proc_info", pid => "$$");
    my $lock = eval {
        $client->lock($key_name,
            limit    => $max_procs,
            ttl_ms   => $ttl_ms,
            wait_ms  => $wait_ms,
            metadata => \%metadata,
            (defined $o{kind} ? (kind => $o{kind}) : ()),
            (defined $o{fair} ? (fair => $o{fair}) : ()),
            (defined $o{holder} ? (holder => $o{holder}) : ()),
            (defined $o{namespace} ? (namespace => $o{namespace}) : ()),
        );
    };
    if (!$lock) {
        my $e = $@;
        return undef
            if Scalar::Util::blessed($e) && $e->isa('Tumbler::Error::NotAcquired');
        die $e;
    }
    return bless {
        lock      => $lock,
        id        => $lock->slot,
        key_name  => $key_name,
        max_procs => $max_procs,
        proc_info => "$proc_info",
    }, $class;
}

# The slot: 1..max_procs, as IPC::ConcurrencyLimit numbers its lock ids.
# The lowest free slot is taken, so ids are reused as the Redis lock does.
sub id            { $_[0]{id} }
sub key_name      { $_[0]{key_name} }
sub max_procs     { $_[0]{max_procs} }
sub proc_info     { $_[0]{proc_info} }
sub lock          { $_[0]{lock} }
sub fencing_token { $_[0]{lock} && $_[0]{lock}->fencing_token }
sub holder        { $_[0]{lock} && $_[0]{lock}->holder }
sub lost          { my $l = $_[0]{lock}; !$l || $l->released || $l->lost ? 1 : 0 }
sub lost_reason   { my $l = $_[0]{lock}; $l ? $l->lost_reason : undef }

# heartbeat: one Extend of the lease, pinned to the fencing token. True while
# the slot is still ours (also when the server is briefly unreachable but
# the lease has time left); false once it is lost: the server answered
# NOT_HELD (released by an admin, reaped) or the lease ran out before a
# renewal. IPC::ConcurrencyLimit->heartbeat drops the lock object on false.
sub heartbeat {
    my $self = shift;
    my $lock = $self->{lock} or return 0;
    return 0 if $lock->released;
    return $lock->heartbeat(force => 1) ? 1 : 0;
}

# release: gives the slot back now (DESTROY does the same).
sub release {
    my $self = shift;
    my $lock = delete $self->{lock} or return 0;
    return $lock->release;
}

sub DESTROY {
    my $self = shift;
    my $lock = delete $self->{lock} or return;
    # Tumbler::Lock's own DESTROY releases (once, in the process that took
    # it, never dying); dropping the last reference here runs it now.
    undef $lock;
}

1;

__END__

=head1 NAME

IPC::ConcurrencyLimit::Lock::Tumbler - IPC::ConcurrencyLimit slots held in the tumbler lock service

=head1 SYNOPSIS

    use IPC::ConcurrencyLimit;

    my $limit = IPC::ConcurrencyLimit->new(
        type      => 'Tumbler',                   # was: type => 'Redis'
        max_procs => 4,
        key_name  => 'mylock',
        proc_info => "host-a pid $$",             # optional, kept as metadata
        endpoint  => 'http://tumbler:50051',      # default: $ENV{TUMBLER_ENDPOINT}
        ttl_ms    => 60_000,                      # the lease; call heartbeat within it
    );
    my $id = $limit->get_lock or exit 0;          # no free slot: undef
    while (my $job = next_job()) {
        $limit->heartbeat or die "lost slot $id\n";
        work($job);
    }

=head1 DESCRIPTION

A lock class for L<IPC::ConcurrencyLimit>: C<type =E<gt> 'Tumbler'> keeps
the options of C<type =E<gt> 'Redis'>. C<max_procs> is the lock's limit,
C<key_name> its name, C<proc_info> goes into the grant's metadata (with the
pid), and the lock id is the tumbler slot (1 to C<max_procs>, the lowest
free one). C<redis_conn> is not used: the tumbler server owns Redis.

Each slot is a lease (C<ttl_ms>, default 60 s). C<heartbeat> extends it
(one Extend, pinned to the grant's fencing token) and returns false once
the slot is lost. The slot is released when the lock object is destroyed;
a process that dies without that (SIGKILL, a segfault, a lost network)
frees its slot when the lease ends, where the Redis lock class kept it
forever.

Options besides the above: C<client> (a L<Tumbler::Client>) or
C<endpoint>, C<token> (default C<$ENV{TUMBLER_TOKEN}>), C<namespace>,
C<timeout> (seconds per call); C<wait_ms> (default 0: try once, as the
other lock classes do), C<fair>, C<kind>, C<holder>, C<metadata>.

C<new> croaks on a bad C<max_procs>, C<key_name>, C<ttl_ms> or C<wait_ms>;
returns undef when every slot is taken; dies with a L<Tumbler::Error>
when the server cannot be reached (C<unavailable>) or refuses the request
(C<invalid_argument>, for example another C<max_procs> for a lock that is
held).

Methods: C<id>, C<heartbeat>, C<release>, C<lost>, C<lost_reason>,
C<fencing_token>, C<holder>, C<lock> (the L<Tumbler::Lock>), C<key_name>,
C<max_procs>, C<proc_info>.

=cut
