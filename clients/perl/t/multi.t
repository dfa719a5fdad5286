use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes ();
use POSIX ();
use Tumbler::Client;
use TumblerTestServer;

# Multi-locks through Tumbler::Client against a real `tumbler serve` over
# its own redis-server: all or nothing, the set extended and released as
# one (also by the guard on scope exit), a waiting set granted once the set
# it overlaps is released, a name twice refused naming names.

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }

my $namespace = "multi-$$";
my $client = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5, namespace => $namespace);

sub error_of(&) {
    my $code = shift;
    return eval { $code->(); 1 } ? undef : $@;
}

sub holders { [ map { scalar @{ $client->inspect($_)->{holders} // [] } } @_ ] }

subtest 'a set with one name held by another holder is busy and leaves the others unheld' => sub {
    my $other = $client->acquire('b', holder => 'other', ttl_ms => 30_000);
    my $e = error_of { $client->acquire_all([qw(a b c)], holder => 'set') };
    isa_ok $e, 'Tumbler::Error::NotAcquired';
    is $e && $e->kind, 'busy', 'busy';
    like $e && $e->message, qr/^a,b,c: /, 'named by the set\'s names';
    is_deeply holders(qw(a b c)), [0, 1, 0], 'a and c stay unheld';
    ok $client->release('b', holder => 'other'), 'the other holder releases b';
    my $set = $client->acquire_all([qw(a b c)], holder => 'set', ttl_ms => 30_000);
    is_deeply holders(qw(a b c)), [1, 1, 1], 'then the set is granted whole';
    ok $client->release_all([qw(a b c)], holder => 'set'), 'released by its holder';
};

subtest 'the grants, extend and release of the set, the guard' => sub {
    my $token;
    {
        my $set = $client->lock_all(['accounts/2', 'accounts/1'], holder => 'mover', ttl_ms => 5000);
        isa_ok $set, 'Tumbler::LockSet';
        is_deeply [ $set->names ], ['accounts/2', 'accounts/1'], 'names in the order asked';
        is_deeply [ map { $_->{name} } $set->grants ], ['accounts/2', 'accounts/1'], 'one grant per name, in order';
        is $set->holder, 'mover', 'one holder';
        $token = $set->fencing_token('accounts/1');
        like $token, qr/^\d+$/, 'each lock\'s fencing token';
        is $set->fencing_token('accounts/3'), undef, 'none for a name not in the set';
        my $before = $client->inspect('accounts/1')->{holders}[0]{grant}{expires_at_ms};
        $set->extend(ttl_ms => 60_000);
        cmp_ok $client->inspect($_)->{holders}[0]{grant}{expires_at_ms}, '>', $before + 30_000, "$_ extended"
            for 'accounts/1', 'accounts/2';
        ok $set->heartbeat(force => 1), 'heartbeat: the set renewed, held';
        is_deeply holders('accounts/1', 'accounts/2'), [1, 1], 'held while the guard lives';
    }
    is_deeply holders('accounts/1', 'accounts/2'), [0, 0], 'the guard released the set on scope exit';

    my $set = $client->lock_all([qw(m n)], holder => 'twice', ttl_ms => 5000);
    ok $set->release, 'release: true while held';
    ok !$set->release, 'a second release: false';
    is_deeply holders(qw(m n)), [0, 0], 'both free';
    $set = $client->lock_all([qw(m n)], holder => 'broken', ttl_ms => 5000);
    ok $client->release('m', holder => 'broken'), 'one lock of the set released alone';
    my $e = error_of { $set->extend };
    isa_ok $e, 'Tumbler::Error::NotHeld', 'extending a broken set';
    ok $set->lost, 'the set is lost';
    is_deeply holders(qw(m n)), [0, 0], 'the server released the rest';
    ok !$client->release_all([qw(m n)], holder => 'broken'), 'release_all: false when not held';
};

subtest 'a waiting set is granted once the set it overlaps is released' => sub {
    my $first = $client->lock_all([qw(p q)], holder => 'first', ttl_ms => 30_000);
    pipe my $r, my $w or die "pipe: $!";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        close $r;
        my $c = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 10, namespace => $namespace);
        my $set = eval { $c->lock_all([qw(q r)], holder => 'second', wait_ms => 10_000, ttl_ms => 5000) };
        print {$w} $set ? join(',', map { $_->{name} } $set->grants) . ' ' . Time::HiRes::time() : "error $@";
        close $w;
        undef $set;
        POSIX::_exit(0);
    }
    close $w;
    my $queued = 0;
    for (1 .. 200) {
        $queued = grep { $_->{holder} eq 'second' } @{ $client->queue('q')->{requests} // [] } and last;
        Time::HiRes::sleep(0.025);
    }
    ok $queued, 'the overlapping set waits, its wake-up place in q\'s queue';
    my $released_at = Time::HiRes::time();
    ok $first->release, 'the first set released';
    my $got = do { local $/; <$r> };
    waitpid $pid, 0;
    my ($names, $at) = split / /, $got // '';
    is $names, 'q,r', "the waiting set is granted ($got)";
    cmp_ok $at // 0, '>=', $released_at, '... after the release';
    is_deeply holders(qw(p q r)), [0, 0, 0], 'all free after';
};

subtest 'a late release of an old set leaves the holder\'s newer set alone' => sub {
    my $old = $client->lock_all([qw(s t)], holder => 'again', ttl_ms => 30_000);
    my @old_tokens = $old->fencing_tokens;
    like "@old_tokens", qr/^\d+ \d+$/, 'a token per name, in order';
    ok $old->release, 'the old set released';
    my $newer = $client->acquire_all([qw(s t)], holder => 'again', ttl_ms => 30_000);
    is scalar @{ $newer->{fencing_tokens} }, 2, 'acquire_all answers the tokens in the order of the names';
    ok !$client->release_all([qw(s t)], holder => 'again', fencing_tokens => \@old_tokens),
        'release_all with the old set\'s tokens: false';
    my $e = error_of { $client->extend_all([qw(s t)], holder => 'again', fencing_tokens => \@old_tokens) };
    isa_ok $e, 'Tumbler::Error::NotHeld', 'extend_all with the old set\'s tokens';
    my @held = map { [ map { [ $_->{grant}{holder}, $_->{grant}{fencing_token} ] }
        @{ $client->inspect($_)->{holders} // [] } ] } qw(s t);
    is_deeply \@held, [ map { [ [ 'again', $_ ] ] } @{ $newer->{fencing_tokens} } ],
        'the newer set still held, with its own tokens';
    $e = error_of { $client->release_all([qw(s t)], holder => 'again', fencing_tokens => [ $old_tokens[0] ]) };
    isa_ok $e, 'Tumbler::Error::InvalidArgument', 'one token for two names';
    like $e && $e->message, qr/^fencing_tokens/, 'the message names fencing_tokens (' . ($e && $e->message) . ')';
    $e = error_of { $client->release_all([qw(s t)], holder => 'again', fencing_tokens => $old_tokens[0]) };
    like $e && $e->message, qr/^fencing_tokens: an array ref/, 'not an array ref: refused here';
    ok $client->release_all([qw(s t)], holder => 'again', fencing_tokens => $newer->{fencing_tokens}),
        'the newer set released with its tokens';
    is_deeply holders(qw(s t)), [0, 0], 'both free';
};

subtest 'a name twice, or one name, is invalid_argument naming names' => sub {
    for my $names ([qw(a a)], ['a']) {
        my $e = error_of { $client->acquire_all($names) };
        isa_ok $e, 'Tumbler::Error::InvalidArgument';
        like $e && $e->message, qr/^names/, 'the message names names (' . ($e && $e->message) . ')';
    }
};

done_testing;
