use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Scalar::Util qw(blessed);
use POSIX ();
use Time::HiRes ();
use Tumbler::Client;
use TumblerTestServer;

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }

my $client = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);
my $other  = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);

subtest 'campaign, leader, proclaim, resign' => sub {
    my $l = $client->campaign('e-perl', value => 'host-a', candidate => 'a', ttl_ms => 5000);
    isa_ok $l, 'Tumbler::Leadership';
    is $l->candidate, 'a', 'candidate';
    ok $l->term > 0, 'a term';
    is $l->value, 'host-a', 'value';
    my $again = $client->campaign('e-perl', value => 'host-a', candidate => 'a', ttl_ms => 5000);
    is $again->term, $l->term, 'a retry of the leader is the same term';
    $again->{released} = 1;   # the same leadership: only one of the two resigns
    is $other->campaign('e-perl', value => 'host-b', candidate => 'b'), undef, 'another candidate: not elected';
    my $now = $other->leader('e-perl');
    is_deeply [ @$now{qw(candidate term value)} ], [ 'a', $l->term, 'host-a' ], 'leader() shows it';
    $l->proclaim("v2 / \"quoted\" \x{2713}");
    is $other->leader('e-perl')->{value}, "v2 / \"quoted\" \x{2713}", 'proclaimed value';
    ok $l->resign, 'resigned';
    ok !$l->resign, 'a second resign: false';
    is $other->leader('e-perl'), undef, 'nobody leads';
    my $e = eval { $l->proclaim('late'); 1 } ? undef : $@;
    ok blessed $e && $e->isa('Tumbler::Error::NotLeader'), 'proclaim after resign dies NotLeader';
    ok $e->isa('Tumbler::Error::LockLost'), '... a LockLost';
    ok $l->lost, 'lost after the refused proclaim';
};

subtest 'heartbeat keeps the lease; a term taken away is lost' => sub {
    my $l = $client->campaign('e-hb', value => 'x', ttl_ms => 600);
    my $until = Time::HiRes::time() + 1.5;
    while (Time::HiRes::time() < $until) { $l->heartbeat or last; Time::HiRes::sleep(0.02) }
    ok !$l->lost, 'still the leader after 1.5 s of a 600 ms lease';
    is $other->leader('e-hb')->{term}, $l->term, 'same term';
    my $refused = eval { $other->resign('e-hb', candidate => $l->candidate, term => $l->term); 1 } ? undef : $@;
    ok blessed $refused && $refused->isa('Tumbler::Error'), 'a resign without the secret: refused';
    is $other->leader('e-hb')->{term}, $l->term, '... and the term still leads';
    ok $other->resign('e-hb', candidate => $l->candidate, term => $l->term, secret => $l->secret),
        'another client told the secret resigns its term';
    ok !$l->heartbeat(force => 1), 'heartbeat: false';
    ok $l->lost, 'lost';
    my $e = eval { $l->check; 1 } ? undef : $@;
    ok blessed $e && $e->isa('Tumbler::Error::NotLeader'), 'check dies NotLeader';
};

subtest 'a waiting campaign is elected when the leader resigns' => sub {
    my $l = $client->campaign('e-wait', value => 'first', ttl_ms => 5000);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        Time::HiRes::sleep(0.5);
        $l->{pid} = -1;   # the parent's leadership: not this process's to resign on exit
        Tumbler::Client->new(endpoint => $server->endpoint)->resign('e-wait', candidate => $l->candidate,
            term => $l->term, secret => $l->secret);
        POSIX::_exit(0);
    }
    my $next = $other->campaign('e-wait', value => 'second', wait_ms => 10_000, ttl_ms => 5000);
    waitpid $pid, 0;
    ok $next, 'elected';
    ok $next->term > $l->term, 'with a higher term';
};

subtest 'observe' => sub {
    my @seen;
    my $l = $client->campaign('e-obs', value => 'v1', ttl_ms => 5000);
    $other->observe('e-obs', sub { push @seen, shift; 0 });
    is scalar @seen, 1, 'a false return stops after one change';
    is $seen[0]{event}, 'current', 'the first change: current';
    is $seen[0]{leader}{term}, $l->term, '... with the leader';
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        Time::HiRes::sleep(0.5);
        my $c = Tumbler::Client->new(endpoint => $server->endpoint);
        $c->proclaim('e-obs', candidate => $l->candidate, term => $l->term, secret => $l->secret, value => 'v2');
        $c->resign('e-obs', candidate => $l->candidate, term => $l->term, secret => $l->secret);
        POSIX::_exit(0);
    }
    @seen = ();
    $other->observe('e-obs', sub { push @seen, shift; $seen[-1]{event} ne 'resigned' }, timeout => 10);
    waitpid $pid, 0;
    is_deeply [ map { $_->{event} } @seen ], [qw(current proclaimed resigned)], 'current, proclaimed, resigned';
    is $seen[1]{leader}{value}, 'v2', 'the proclaimed value';
    is $seen[2]{leader}, undef, 'nobody leads after the resign';
    is $seen[2]{ended_term}, $l->term, 'the term that ended';
    $l->{released} = 1;
    my $e = eval { $client->observe('', sub { 1 }); 1 } ? undef : $@;
    ok blessed $e && $e->isa('Tumbler::Error::InvalidArgument'), 'a bad name: InvalidArgument';
};

done_testing;
