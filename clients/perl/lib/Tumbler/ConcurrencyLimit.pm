package Tumbler::ConcurrencyLimit;
use strict;
use warnings;
use Carp ();
use IPC::ConcurrencyLimit::Lock::Tumbler;

our $VERSION = '0.1.0';

# The IPC::ConcurrencyLimit surface (new, get_lock, release_lock, is_locked,
# lock_id, heartbeat) over tumbler, for programs without that module.
sub new {
    my ($class, %opts) = @_;
    my $type = delete $opts{type};
    Carp::croak("Tumbler::ConcurrencyLimit only does type => 'Tumbler', not '$type'")
        if defined $type && $type ne 'Tumbler';
    my $self = bless { opts => { max_procs => 1, %opts }, lock => undef }, $class;
    # The options are checked here, so a mistake shows before the first get_lock.
    IPC::ConcurrencyLimit::Lock::Tumbler::_check($self->{opts});
    return $self;
}

# get_lock: the slot id (1..max_procs), or undef when none is free. Calls
# while a slot is held return the same id (they do not stack).
sub get_lock {
    my $self = shift;
    return $self->{lock}->id if $self->{lock};
    $self->{lock} = IPC::ConcurrencyLimit::Lock::Tumbler->new($self->{opts});
    return $self->{lock} ? $self->{lock}->id : undef;
}

sub is_locked { $_[0]{lock} ? 1 : 0 }

sub lock_id { $_[0]{lock} ? $_[0]{lock}->id : undef }

# release_lock: 1 when a slot was held (and is now given back), undef when
# there was none. Like IPC::ConcurrencyLimit it drops the lock object, whose
# destructor releases and never dies: a release the server did not get ends
# with the lease.
sub release_lock {
    my $self = shift;
    return undef unless $self->{lock};
    $self->{lock} = undef;
    return 1;
}

# heartbeat: extends the slot's lease. True while it is held; false, and the
# slot dropped (is_locked false), once it was lost; undef without a slot.
sub heartbeat {
    my $self = shift;
    my $lock = $self->{lock} or return undef;
    return 1 if $lock->heartbeat;
    $self->{lock} = undef;
    return 0;
}

# Beyond IPC::ConcurrencyLimit: the lock object and its fencing token.
sub lock_obj      { $_[0]{lock} }
sub fencing_token { $_[0]{lock} ? $_[0]{lock}->fencing_token : undef }

1;

__END__

=head1 NAME

Tumbler::ConcurrencyLimit - IPC::ConcurrencyLimit's interface over tumbler, without IPC::ConcurrencyLimit

=head1 SYNOPSIS

    use Tumbler::ConcurrencyLimit;

    my $limit = Tumbler::ConcurrencyLimit->new(
        max_procs => 4,
        key_name  => 'mylock',
        endpoint  => 'http://tumbler:50051',
    );
    my $id = $limit->get_lock or exit 0;   # slot 1..4, undef when all are taken
    $limit->heartbeat or die "lost slot $id\n";
    $limit->release_lock;                  # or let $limit go out of scope

=head1 DESCRIPTION

The methods of L<IPC::ConcurrencyLimit> (C<get_lock>, C<release_lock>,
C<is_locked>, C<lock_id>, C<heartbeat>) with the options of
L<IPC::ConcurrencyLimit::Lock::Tumbler>. C<max_procs> defaults to 1.
Bad options croak in C<new>. C<heartbeat> returns false and drops the slot
once it was lost. C<fencing_token> gives the grant's token for fencing the
resource the slot protects.

=cut
