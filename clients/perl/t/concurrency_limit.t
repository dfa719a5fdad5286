use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes ();
use Tumbler::Client;
use Tumbler::ConcurrencyLimit;
use TumblerTestServer;

sub error_of(&) { my $code = shift; return eval { $code->(); 1 } ? undef : $@ }

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }
my $endpoint = $server->endpoint;
my $admin = Tumbler::Client->new(endpoint => $endpoint, timeout => 5);
my @common = (endpoint => $endpoint, key_name => 'tcl', timeout => 5);

sub holders { my $i = $admin->inspect(shift); return scalar @{ $i->{holders} // [] } }

subtest 'get_lock, is_locked, lock_id, release_lock' => sub {
    my $limit = Tumbler::ConcurrencyLimit->new(@common);
    isa_ok $limit, 'Tumbler::ConcurrencyLimit';
    ok !$limit->is_locked, 'not locked by new';
    is $limit->release_lock, undef, 'release_lock without a lock: undef';
    is $limit->heartbeat, undef, 'heartbeat without a lock: undef';
    is $limit->lock_id, undef, 'no lock id';
    is $limit->get_lock, 1, 'get_lock: id 1';
    is $limit->get_lock, 1, 'again: the same id';
    ok $limit->is_locked, 'is_locked';
    is $limit->lock_id, 1, 'lock_id';
    like $limit->fencing_token, qr/^\d+$/, 'fencing_token';
    my $other = Tumbler::ConcurrencyLimit->new(@common);
    is $other->get_lock, undef, 'a second limit gets no lock';
    ok !$other->is_locked, '... and is not locked';
    is $limit->release_lock, 1, 'release_lock: 1';
    ok !$limit->is_locked, 'not locked';
    is $limit->lock_id, undef, 'no id';
    is holders('tcl'), 0, 'released on the server';
    is $other->get_lock, 1, 'the other gets it now';
    undef $other;
    is holders('tcl'), 0, 'released when the limit went out of scope';
};

subtest 'max_procs 2' => sub {
    my @l = map { Tumbler::ConcurrencyLimit->new(@common, key_name => 'tcl-2', max_procs => 2) } 1 .. 3;
    my @ids = map { $_->get_lock } @l;
    is_deeply \@ids, [ 1, 2, undef ], 'two slots, the third refused';
    $l[0]->release_lock;
    is $l[2]->get_lock, 1, 'the freed slot 1 reused';
};

subtest 'heartbeat' => sub {
    my $limit = Tumbler::ConcurrencyLimit->new(@common, key_name => 'tcl-beat', ttl_ms => 500);
    $limit->get_lock;
    for (1 .. 8) { $limit->heartbeat or last; Time::HiRes::sleep(0.15) }
    ok $limit->is_locked, 'held through 1.2 s on a 500 ms lease';
    $admin->clear;
    is $limit->heartbeat, 0, 'false once lost';
    ok !$limit->is_locked, 'and the lock is dropped';
    is $limit->get_lock, 1, 'get_lock takes a new one';
    ok !$limit->lock_obj->lost, 'held';
};

subtest 'bad input' => sub {
    like error_of { Tumbler::ConcurrencyLimit->new(@common, type => 'Redis') },
        qr/only does type => 'Tumbler'/, "type => 'Redis' refused";
    like error_of { Tumbler::ConcurrencyLimit->new(@common, max_procs => 0) },
        qr/^max_procs must be a whole number of at least 1/, 'max_procs 0: at new';
    like error_of { Tumbler::ConcurrencyLimit->new(endpoint => $endpoint, key_name => '') },
        qr/^key_name is required/, 'empty key_name';
    ok(Tumbler::ConcurrencyLimit->new(@common, type => 'Tumbler'), "type => 'Tumbler' accepted");
    my $port = TumblerTestServer::free_port();
    my $down = Tumbler::ConcurrencyLimit->new(key_name => 'x', endpoint => "http://127.0.0.1:$port", timeout => 0.3);
    my $e = error_of { $down->get_lock };
    isa_ok $e, 'Tumbler::Error::Unavailable', 'an unreachable server';
    ok !$down->is_locked, 'not locked';
};

done_testing;
