package Tumbler::Leadership;
use strict;
use warnings;
use Scalar::Util ();
use Tumbler::Error;
use Tumbler::Lock;

# A leadership is a Tumbler::Lock whose holder is the candidate and whose
# fencing token is the term: heartbeat extends its lease (pinned to the
# term), lost and check tell when the term ended under it. proclaim and
# resign act only with this term.
our @ISA = ('Tumbler::Lock');
our $VERSION = '0.1.0';

sub _new {
    my ($class, $client, $name, $leader, $namespace, $secret) = @_;
    my $grant = {
        holder         => $leader->{candidate},
        fencing_token  => $leader->{term},
        slot           => 1,
        acquired_at_ms => $leader->{elected_at_ms},
        expires_at_ms  => $leader->{expires_at_ms},
        ttl_ms         => $leader->{ttl_ms},
    };
    my $self = $class->SUPER::_new($client, $name, $grant, $namespace);
    $self->{leader} = $leader;
    # Told only to the winning Campaign: proclaim and resign send it.
    $self->{secret} = $secret // '';
    return $self;
}

sub leader    { $_[0]{leader} }
sub candidate { $_[0]{leader}{candidate} }
sub term      { $_[0]{leader}{term} }
sub value     { $_[0]{leader}{value} }
# The secret only the winning campaign was told (proclaim and resign send it).
sub secret    { $_[0]{secret} }
sub resigned  { $_[0]{released} }

# True once the term is known to be over under this leader (kept after a
# resign: a refused proclaim of a resigned term says so too).
sub lost {
    my $self = shift;
    return 1 if $self->{lost};
    return $self->SUPER::lost;
}

sub check {
    my $self = shift;
    return $self unless $self->lost;
    die Tumbler::Error::NotLeader->new(
        kind => 'lost', code => 'not_leader', method => 'check', reason => $self->{lost_reason},
        message => "$self->{name}: $self->{leader}{candidate} no longer leads (term $self->{leader}{term}): "
            . $self->{lost_reason},
    );
}

# proclaim($value): replaces the value others see. Dies
# Tumbler::Error::NotLeader (and the leadership is lost from then on) when
# the term is over.
sub proclaim {
    my ($self, $value, %opts) = @_;
    my $leader = eval {
        $self->{client}->proclaim($self->{name}, $self->_ns, candidate => $self->candidate, term => $self->term,
            secret => $self->{secret}, value => $value, %opts);
    };
    if (my $e = $@) {
        $self->_lose('not the leader') if Scalar::Util::blessed($e) && $e->isa('Tumbler::Error::NotLeader');
        die $e;
    }
    $self->{leader} = $leader;
    return $self;
}

# resign: steps down at once (the next candidate is elected). True when
# this call ended the term, false when it was over already; safe to call
# more than once. Leaving the scope resigns too.
sub resign {
    my ($self, %opts) = @_;
    return 0 if $self->{released};
    my $resigned = $self->{client}->resign($self->{name}, $self->_ns, candidate => $self->candidate,
        term => $self->term, secret => $self->{secret}, %opts);
    $self->{released} = 1;
    return $resigned;
}

sub release { shift->resign(@_) }

1;

__END__

=head1 NAME

Tumbler::Leadership - one term of this process as an election's leader

=head1 SYNOPSIS

    my $leadership = $client->campaign('scheduler', value => $my_address, wait_ms => 5_000, ttl_ms => 3_000)
        or return;   # another replica led for the whole wait
    while (my $job = next_job()) {
        $leadership->heartbeat or last;                   # the term ended under us
        schedule($job, fence => $leadership->term);
    }
    $leadership->resign;   # or leave the scope

=head1 DESCRIPTION

Returned by C<< Tumbler::Client->campaign >>. A L<Tumbler::Lock> whose
holder is the candidate and whose fencing token is the term, so
C<heartbeat> extends the lease (Perl has no watchdog thread here: call it
from the loop, more often than a third of the TTL), and C<lost> is true once
an extend answered NOT_HELD, the lease passed without a renewal, or
C<proclaim> was refused. C<check> dies C<Tumbler::Error::NotLeader> then.
C<candidate>, C<term>, C<value> and C<leader> (the whole leadership hash)
read it; C<proclaim($value)> replaces the value (dies
C<Tumbler::Error::NotLeader> when the term is over); C<resign> steps down
(true when it ended the term, false after that). Leaving the scope resigns.

=cut
