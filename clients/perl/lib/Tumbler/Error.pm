package Tumbler::Error;
use strict;
use warnings;
use overload '""' => sub { $_[0]->as_string }, bool => sub { 1 }, fallback => 1;

our $VERSION = '0.1.0';

# kind: busy, timeout, not_held, lost, unavailable, tls, denied, invalid_argument,
# failed_precondition, deadlock, or the Connect code itself for anything else
# (internal, not_found, ...).
my %CLASS_FOR_CODE = (
    invalid_argument    => [ 'Tumbler::Error::InvalidArgument', 'invalid_argument' ],
    failed_precondition => [ 'Tumbler::Error::FailedPrecondition', 'failed_precondition' ],
    out_of_range        => [ 'Tumbler::Error::InvalidArgument', 'invalid_argument' ],
    permission_denied   => [ 'Tumbler::Error::Denied',          'denied' ],
    unauthenticated     => [ 'Tumbler::Error::Denied',          'denied' ],
    unavailable         => [ 'Tumbler::Error::Unavailable',     'unavailable' ],
);

my %CODE_FOR_HTTP = (
    400 => 'invalid_argument', 401 => 'unauthenticated', 403 => 'permission_denied',
    404 => 'unimplemented',    409 => 'aborted',         429 => 'resource_exhausted',
    499 => 'canceled',         501 => 'unimplemented',   503 => 'unavailable',
    504 => 'deadline_exceeded',
);

sub new {
    my ($class, %args) = @_;
    my $self = bless { %args }, $class;
    $self->{message} //= '';
    return $self;
}

# An error from a Connect answer: the code and message of its JSON body, or
# the code Connect gives the HTTP status when the body is not Connect's.
sub from_connect {
    my ($class, %args) = @_;
    my $code = $args{code} // $CODE_FOR_HTTP{ $args{http_status} // 0 } // 'unknown';
    my ($sub, $kind) = @{ $CLASS_FOR_CODE{$code} // [ 'Tumbler::Error', $code ] };
    # A wait that would close a wait-for cycle: aborted, its message naming
    # the cycle (other aborted answers, such as a session taken over, say
    # something else).
    ($sub, $kind) = ('Tumbler::Error::Deadlock', 'deadlock')
        if $code eq 'aborted' && ($args{message} // '') =~ /^deadlock: /;
    return $sub->new(%args, code => $code, kind => $kind);
}

sub throw { my $class = shift; die $class->new(@_) }

sub kind        { $_[0]{kind} }
sub code        { $_[0]{code} }
sub message     { $_[0]{message} }
sub http_status { $_[0]{http_status} }
sub method      { $_[0]{method} }

sub as_string {
    my $self = shift;
    my $s = 'tumbler: ' . ($self->{code} // $self->{kind});
    $s .= " ($self->{method})" if $self->{method};
    $s .= ": $self->{message}" if length $self->{message};
    return "$s\n";
}

package Tumbler::Error::NotAcquired;      # kind busy (NOT_ACQUIRED/BUSY) or timeout
our @ISA = ('Tumbler::Error');
sub reason { $_[0]{reason} }
sub holders { $_[0]{holders} }

package Tumbler::Error::NotHeld;          # kind not_held: Extend answered NOT_HELD
our @ISA = ('Tumbler::Error');

package Tumbler::Error::LockLost;         # kind lost: $lock->check on a lost lock
our @ISA = ('Tumbler::Error');
sub reason { $_[0]{reason} }

package Tumbler::Error::NotLeader;        # kind lost, code not_leader: the leadership's term is over
our @ISA = ('Tumbler::Error::LockLost');

package Tumbler::Error::Unavailable;      # kind unavailable, after the retries
our @ISA = ('Tumbler::Error');
sub attempts { $_[0]{attempts} }

package Tumbler::Error::TLS;              # kind tls: the server's certificate did not verify (not retried)
our @ISA = ('Tumbler::Error');
sub attempts { $_[0]{attempts} }

package Tumbler::Error::Denied;           # kind denied: permission_denied, unauthenticated
our @ISA = ('Tumbler::Error');

package Tumbler::Error::InvalidArgument;  # kind invalid_argument, naming the field
our @ISA = ('Tumbler::Error');

package Tumbler::Error::FailedPrecondition;  # kind failed_precondition: not in the lock's present state
our @ISA = ('Tumbler::Error::InvalidArgument');

package Tumbler::Error::Deadlock;         # kind deadlock: the wait would close a wait-for cycle
our @ISA = ('Tumbler::Error');

1;

__END__

=head1 NAME

Tumbler::Error - typed errors of Tumbler::Client

=head1 SYNOPSIS

    use Scalar::Util qw(blessed);
    eval { $client->acquire('reports'); 1 } or do {
        my $e = $@;
        die $e unless blessed $e && $e->isa('Tumbler::Error');
        if ($e->kind eq 'busy') { ... }
    };

=head1 DESCRIPTION

Every error is a C<Tumbler::Error> with C<kind>, C<code> (the Connect code,
such as C<invalid_argument>), C<message> (the server's, which names the
field) and C<http_status>. Subclasses: C<Tumbler::Error::NotAcquired>
(kind C<busy> or C<timeout>, with C<reason>), C<Tumbler::Error::NotHeld>
(C<not_held>), C<Tumbler::Error::LockLost> (C<lost>),
C<Tumbler::Error::Unavailable> (C<unavailable>, with C<attempts>),
C<Tumbler::Error::TLS> (C<tls>: an https server whose certificate did not
verify against C<ca_file> or the system's CAs; not retried, nothing was
sent to it),
C<Tumbler::Error::Denied> (C<denied>: C<permission_denied> or
C<unauthenticated>), C<Tumbler::Error::InvalidArgument>
(C<invalid_argument>: a field breaks its rule, named in the message), its
subclass C<Tumbler::Error::FailedPrecondition> (C<failed_precondition>:
the request is well formed but the lock's present state refuses it, such
as another limit or mode for a held lock, or an upgrade), and
C<Tumbler::Error::Deadlock> (C<deadlock>: code C<aborted>, the wait would
close a wait-for cycle, which the message names). Other Connect codes are a plain C<Tumbler::Error>
whose kind is the code.

=cut
