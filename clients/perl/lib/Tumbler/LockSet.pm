package Tumbler::LockSet;
use strict;
use warnings;
use Carp ();
use Tumbler::Lock;

our @ISA = ('Tumbler::Lock');
our $VERSION = '0.1.0';

# A multi-lock's set as one Tumbler::Lock: its Extend and Release name the
# set, so heartbeat, lost, check and the release on scope exit are the
# lock's. Each lock is pinned to its own token, so a late release of this
# set never touches a newer set of the same holder. Its grant is the one
# whose lease ends first.
sub _new_set {
    my ($class, $client, $set) = @_;
    my ($first) = sort { $a->{expires_at_ms} <=> $b->{expires_at_ms} } @{ $set->{grants} };
    my $self = $class->_new($client, join(',', @{ $set->{names} }), { %$first, holder => $set->{holder}, status => $set->{status} },
        $set->{namespace});
    my %token = map { ($_->{name} => $_->{fencing_token}) } @{ $set->{grants} };
    @$self{qw(names grants fencing_tokens)} =
        ([ @{ $set->{names} } ], $set->{grants}, [ map { $token{$_} } @{ $set->{names} } ]);
    return $self;
}

# The names, in the order asked (a list).
sub names  { @{ $_[0]{names} } }
# The grants as acquired, one hash per name in the order asked (a list).
sub grants { @{ $_[0]{grants} } }

# Each lock's fencing token, in the order of the names (a list): the set's
# extend and release are pinned to them.
sub fencing_tokens { @{ $_[0]{fencing_tokens} } }

# The fencing token of the lock $name of the set (undef: not in the set).
sub fencing_token {
    my ($self, $name) = @_;
    Carp::croak('fencing_token of a set needs the lock name') unless defined $name;
    my ($grant) = grep { $_->{name} eq $name } @{ $self->{grants} };
    return $grant ? $grant->{fencing_token} : undef;
}

sub downgrade { Carp::croak('a multi-lock has no read/write mode to downgrade') }

sub _extend_call {
    my ($self, %opts) = @_;
    return $self->{client}->extend_all($self->{names}, $self->_ns, holder => $self->holder,
        fencing_tokens => $self->{fencing_tokens}, %opts);
}

sub _release_call {
    my ($self, %opts) = @_;
    return $self->{client}->release_all($self->{names}, $self->_ns, holder => $self->holder,
        fencing_tokens => $self->{fencing_tokens}, %opts);
}

1;

__END__

=head1 NAME

Tumbler::LockSet - a tumbler multi-lock held for a scope

=head1 SYNOPSIS

    {
        my $set = $client->lock_all(['accounts/1', 'accounts/2'], ttl_ms => 30_000, wait_ms => 5_000);
        move_money(from_fence => $set->fencing_token('accounts/1'),
                   to_fence   => $set->fencing_token('accounts/2'));
    }   # the whole set released here

=head1 DESCRIPTION

Returned by C<< Tumbler::Client->lock_all >>: every lock of the set, held
together by one holder. A L<Tumbler::Lock> whose C<extend>, C<heartbeat>
and C<release> (also on scope exit) name the whole set: C<names> and
C<grants> (one grant hash per name in the order asked, each with its
C<name> and own C<fencing_token>), C<fencing_token($name)>,
C<fencing_tokens> (one per name, in order), C<holder>. Its release and
extend are pinned to the tokens it was granted.
C<lost> is true once an extend of the set answered NOT_HELD (any lock of
it gone: the server then releases the others) or the lease passed without
a renewal.

=cut
