use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Scalar::Util qw(blessed);
use Time::HiRes ();
use POSIX ();
use Tumbler::Client;
use TumblerTestServer;

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }

my $client = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);
my $other  = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);

sub error_of(&) {
    my $code = shift;
    return eval { $code->(); 1 } ? undef : $@;
}

subtest 'acquire and release' => sub {
    my $g = $client->acquire('a-r', ttl_ms => 5000, metadata => { job => 'nightly' });
    is $g->{status}, 'acquired', 'acquired';
    like $g->{fencing_token}, qr/^\d+$/, 'fencing token';
    like $g->{holder}, qr/\S/, 'a holder made by the client';
    is $g->{metadata}{job}, 'nightly', 'metadata kept';
    my $again = $client->acquire('a-r', holder => $g->{holder}, ttl_ms => 5000);
    is $again->{status}, 'already_held', 'the same holder again: already held (a safe retry)';
    is $again->{fencing_token}, $g->{fencing_token}, '... with the same token';
    my $info = $client->inspect('a-r');
    is scalar @{ $info->{holders} }, 1, 'inspect: one holder';
    is $info->{holders}[0]{grant}{holder}, $g->{holder}, 'inspect: the holder';
    ok $client->release('a-r', holder => $g->{holder}, fencing_token => $g->{fencing_token}), 'released';
    ok !$client->release('a-r', holder => $g->{holder}), 'a second release: not held';
};

subtest 'busy' => sub {
    my $g = $client->acquire('busy', ttl_ms => 5000);
    my $e = error_of { $other->acquire('busy') };
    isa_ok $e, 'Tumbler::Error::NotAcquired';
    is $e->kind, 'busy', 'kind busy';
    ok $client->release('busy', holder => $g->{holder}), 'released';
    ok $other->acquire('busy', ttl_ms => 1000), 'free again';
};

subtest 'wait with timeout' => sub {
    my $g = $client->acquire('wait', ttl_ms => 5000);
    my $t0 = Time::HiRes::time();
    my $e = error_of { $other->acquire('wait', wait_ms => 400) };
    my $took = Time::HiRes::time() - $t0;
    isa_ok $e, 'Tumbler::Error::NotAcquired';
    is $e->kind, 'timeout', 'kind timeout';
    cmp_ok $took, '>=', 0.3, 'waited';
    cmp_ok $took, '<', 3, 'not much longer than wait_ms';
    $client->release('wait', holder => $g->{holder});

    my $short = $client->acquire('wait', ttl_ms => 500);
    my $next = $other->acquire('wait', wait_ms => 5000, ttl_ms => 1000);
    is $next->{status}, 'acquired', 'a waiter gets it when the lease ends';
    cmp_ok $next->{fencing_token}, '>', $short->{fencing_token}, 'with a higher token';
};

subtest 'fencing tokens rise' => sub {
    my @tokens;
    for (1 .. 5) {
        my $l = $client->lock('fence', ttl_ms => 2000);
        push @tokens, $l->fencing_token;
    }
    my @sorted = sort { $a <=> $b } @tokens;
    is_deeply \@tokens, \@sorted, 'each grant a higher token';
    my %seen = map { $_ => 1 } @tokens;
    is scalar keys %seen, 5, 'all different';
};

subtest 'guard released on scope exit' => sub {
    {
        my $lock = $client->lock('scope', ttl_ms => 30_000);
        ok !$lock->lost, 'held';
        my $e = error_of { $other->acquire('scope') };
        is $e && $e->kind, 'busy', 'others refused while in scope';
    }
    is scalar @{ $client->inspect('scope')->{holders} // [] }, 0, 'no holder after the scope';
    my $l = $other->lock('scope', ttl_ms => 1000);
    ok $l, 'free for others';
    ok $l->release, 'explicit release';
    ok !$l->release, 'a second release is a no-op';
    {
        my $e = error_of { my $x = $client->lock('scope-die', ttl_ms => 30_000); die "body failed\n" };
        is $e, "body failed\n", 'the body\'s error passes through';
    }
    is scalar @{ $client->inspect('scope-die')->{holders} // [] }, 0, 'released when the body died';
};

subtest 'extend and heartbeat' => sub {
    my $lock = $client->lock('beat', ttl_ms => 600);
    is $lock->heartbeat, 1, 'heartbeat before a third of the TTL: nothing to do';
    my $exp = $lock->grant->{expires_at_ms};
    my $until = Time::HiRes::time() + 1.5;
    while (Time::HiRes::time() < $until) {
        $lock->heartbeat or last;
        Time::HiRes::sleep(0.1);
    }
    ok !$lock->lost, 'held through 1.5 s on a 600 ms lease';
    cmp_ok $lock->grant->{expires_at_ms}, '>', $exp, 'the lease moved on';
    my $e = error_of { $other->acquire('beat') };
    is $e && $e->kind, 'busy', 'still held';
    $lock->extend(ttl_ms => 5000);
    is $lock->grant->{ttl_ms}, 5000, 'extend with a new TTL';
    Time::HiRes::sleep(0.7);
    ok !$lock->lost, 'the new TTL counts';
    ok $lock->check, 'check passes';
    ok $lock->release, 'released';
};

subtest 'lost after an admin clear' => sub {
    my $lock = $client->lock('lost', ttl_ms => 5000);
    my $cleared = $other->clear;
    cmp_ok $cleared->{grants_released}, '>=', 1, 'clear released grants';
    ok !$lock->lost, 'not known yet';
    is $lock->heartbeat(force => 1), 0, 'the heartbeat finds it gone';
    ok $lock->lost, 'lost';
    my $e = error_of { $lock->check };
    isa_ok $e, 'Tumbler::Error::LockLost';
    is $e->kind, 'lost', 'kind lost';
    $e = error_of { $lock->extend };
    isa_ok $e, 'Tumbler::Error::LockLost', 'extend on a lost lock';
    my $raw = error_of { $client->extend('lost', holder => $lock->holder) };
    isa_ok $raw, 'Tumbler::Error::NotHeld';
    is $raw->kind, 'not_held', 'kind not_held';
    undef $lock;   # DESTROY must not die
    pass 'guard of a lost lock destroyed quietly';
};

subtest 'lost when the lease passes' => sub {
    my $lock = $client->lock('expire', ttl_ms => 300);
    Time::HiRes::sleep(0.4);
    ok $lock->lost, 'lost after the lease without a heartbeat';
    is $lock->heartbeat, 0, 'heartbeat says so';
};

subtest 'invalid argument names the field' => sub {
    my $e = error_of { $client->acquire('bad', ttl_ms => 'soon') };
    isa_ok $e, 'Tumbler::Error::InvalidArgument';
    is $e->kind, 'invalid_argument', 'kind';
    is $e->code, 'invalid_argument', 'code';
    is $e->http_status, 400, 'HTTP 400';
    like $e->message, qr/ttlMs/, 'names ttlMs';
    $e = error_of { $client->acquire('') };
    like $e && $e->message, qr/^name/, 'an empty name: names name';
    $e = error_of { $client->acquire('bad', ttl => 5) };
    is $e && $e->kind, 'invalid_argument', 'an unknown option';
    like $e && $e->message, qr/ttl/, '... named';
};

subtest 'list, queue, reap, metrics' => sub {
    my $lock = $client->lock('listed', ttl_ms => 5000);
    my $list = $client->list(prefix => 'listed');
    is_deeply [ map { $_->{name} } @{ $list->{locks} } ], ['listed'], 'list by prefix';
    my $q = $client->queue('listed');
    is $q->{waiters} // 0, 0, 'queue: no waiters';
    ok ref $client->reap eq 'HASH', 'reap';
    my $m = $client->metrics;
    ok $m->{overall}{acquired} >= 1, 'metrics: acquired counted';
};

subtest 'a die from a signal handler stops a waiting acquire' => sub {
    my $g = $client->acquire('interrupted', ttl_ms => 10_000);
    my $t0 = Time::HiRes::time();
    my $e = error_of {
        local $SIG{ALRM} = sub { die "gave up\n" };
        Time::HiRes::alarm(0.3);
        $other->acquire('interrupted', holder => 'impatient', wait_ms => 10_000);
    };
    Time::HiRes::alarm(0);
    my $took = Time::HiRes::time() - $t0;
    is $e, "gave up\n", 'the handler\'s exception, unchanged (not retried as unavailable)';
    cmp_ok $took, '<', 1, sprintf('at once (%.2f s)', $took);
    my $queued = 1;
    for (1 .. 50) {
        $queued = grep { $_->{holder} eq 'impatient' } @{ $client->queue('interrupted')->{requests} // [] };
        last unless $queued;
        Time::HiRes::sleep(0.02);
    }
    ok !$queued, 'the server dropped the waiting request';
    ok $other->lock('free-after', ttl_ms => 1000), 'the client works after that';
    $client->release('interrupted', holder => $g->{holder});
};

subtest 'unavailable after the deadline' => sub {
    my $port = TumblerTestServer::free_port();
    my $down = Tumbler::Client->new(endpoint => "http://127.0.0.1:$port", timeout => 0.6);
    my $t0 = Time::HiRes::time();
    my $e = error_of { $down->acquire('nobody') };
    my $took = Time::HiRes::time() - $t0;
    isa_ok $e, 'Tumbler::Error::Unavailable';
    is $e->kind, 'unavailable', 'kind unavailable';
    cmp_ok $e->attempts, '>', 1, 'retried (' . $e->attempts . ' attempts)';
    cmp_ok $took, '>=', 0.55, 'until the deadline';
    cmp_ok $took, '<', 2, 'and not much longer';
};

subtest 'weighted permits' => sub {
    my $big = $client->acquire('pool', holder => 'big', limit => 5, permits => 3, ttl_ms => 5000);
    is $big->{permits}, 3, 'a big job holds 3 of 5 permits';
    is_deeply $big->{slots}, [1, 2, 3], '... one slot per permit';
    is $big->{slot}, 1, '... slot is the first of them';
    my $e = error_of { $other->acquire('pool', holder => 'other', limit => 5, permits => 3) };
    isa_ok $e, 'Tumbler::Error::NotAcquired';
    is $e->kind, 'busy', '3 more do not fit: busy';
    is $e->holders, 3, '... with 3 permits in use';
    my $small = $other->lock('pool', holder => 'small', limit => 5, permits => 2, ttl_ms => 5000);
    is $small->permits, 2, '2 fit beside them (the guard)';
    is_deeply [ $small->slots ], [4, 5], '... in slots 4 and 5';
    is $client->inspect('pool')->{permits_in_use}, 5, 'inspect: 5 permits in use';
    $small->extend;
    is_deeply [ $small->permits, $small->slots ], [2, 4, 5], 'extended: the same permits and slots';
    my $plain = $client->acquire('pool-plain', limit => 2, ttl_ms => 5000);
    is_deeply [ $plain->{permits}, $plain->{slots} ], [1, [ $plain->{slot} ]], 'a plain grant: 1 permit, its slot';
    $e = error_of { $client->acquire('pool', limit => 5, permits => 6) };
    isa_ok $e, 'Tumbler::Error::InvalidArgument';
    is $e->code, 'invalid_argument', '6 of 5: code invalid_argument';
    like $e->message, qr/^permits/, '... with the server\'s message naming permits (' . $e->message . ')';
    undef $small;
    ok $client->release('pool', holder => 'big'), 'released';
    $client->release('pool-plain', holder => $plain->{holder});
};

subtest 'a wait that would close a cycle dies Tumbler::Error::Deadlock' => sub {
    # "pl-a" holds dl-x, "pl-b" holds dl-y; a child process waits for dl-x
    # as "pl-b" (its wait is checked, and so recorded, after a tenth of its
    # 3 s). Then "pl-a" asking dl-y would wait for "pl-b", which waits for
    # "pl-a": refused as soon as its own check is due, naming the cycle.
    $client->acquire('dl-x', holder => 'pl-a', ttl_ms => 20_000);
    $client->acquire('dl-y', holder => 'pl-b', ttl_ms => 20_000);
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $c = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 10);
        eval { $c->acquire('dl-x', holder => 'pl-b', ttl_ms => 20_000, wait_ms => 3000) };
        POSIX::_exit(0);
    }
    my $queued = 0;
    for (1 .. 100) {
        $queued = scalar @{ $client->queue('dl-x')->{requests} // [] } and last;
        Time::HiRes::sleep(0.05);
    }
    is $queued, 1, 'pl-b waits for dl-x';
    Time::HiRes::sleep(0.6);    # past pl-b's check: its edge is recorded
    my $t0 = Time::HiRes::time();
    my $e = error_of { $client->acquire('dl-y', holder => 'pl-a', ttl_ms => 20_000, wait_ms => 5000) };
    isa_ok $e, 'Tumbler::Error::Deadlock';
    is $e && $e->kind, 'deadlock', 'kind deadlock';
    is $e && $e->code, 'aborted', 'code aborted';
    like $e && $e->message, qr/^deadlock: .*pl-a.*dl-y.*pl-b|^deadlock: .*pl-b.*dl-x.*pl-a/, 'the message names the cycle';
    cmp_ok Time::HiRes::time() - $t0, '<', 2.5, 'long before its wait would end';
    $client->release('dl-x', holder => 'pl-a');
    waitpid $pid, 0;
    $client->release($_, holder => 'pl-b') for qw(dl-x dl-y);
};

done_testing;
