use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use POSIX ();
use Scalar::Util qw(blessed);
use Time::HiRes ();
use IPC::ConcurrencyLimit::Lock::Tumbler;
use Tumbler::Client;
use TumblerTestServer;

# IPC::ConcurrencyLimit::Lock::Tumbler driven the way IPC::ConcurrencyLimit
# drives a lock class (IPC::ConcurrencyLimit itself is not installed here):
# new() takes `type` out of the user's options, adds max_procs => 1 unless
# given, and keeps the rest as one hash; get_lock returns the held lock's
# id, or calls CLASS->new(\%opts) and returns its id or undef; release_lock
# drops the lock object; heartbeat calls the object's heartbeat and drops
# the object when that is false.
my $CLASS = 'IPC::ConcurrencyLimit::Lock::Tumbler';

sub limit_new { my %p = @_; delete $p{type}; return { opt => { max_procs => 1, %p }, obj => undef } }
sub get_lock {
    my $l = shift;
    return $l->{obj}->id if $l->{obj};
    $l->{obj} = $CLASS->new($l->{opt});
    return $l->{obj} ? $l->{obj}->id : undef;
}
sub release_lock { my $l = shift; return undef unless $l->{obj}; $l->{obj} = undef; return 1 }
sub heartbeat {
    my $l = shift;
    return unless $l->{obj};
    return 1 if $l->{obj}->heartbeat;
    release_lock($l);
    return;
}

sub error_of(&) { my $code = shift; return eval { $code->(); 1 } ? undef : $@ }

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }
my $endpoint = $server->endpoint;
my $admin = Tumbler::Client->new(endpoint => $endpoint, timeout => 5);
my @common = (type => 'Tumbler', endpoint => $endpoint, timeout => 5);

sub holders { my $i = $admin->inspect(shift); return @{ $i->{holders} // [] } }

subtest 'one slot: id 1, a second process refused, released on destruction' => sub {
    my $a = limit_new(@common, key_name => 'ipc-one', proc_info => 'worker a');
    my $b = limit_new(@common, key_name => 'ipc-one');
    ok !release_lock($a), 'nothing to release yet';
    is get_lock($a), 1, 'the first lock has id 1';
    is get_lock($a), 1, 'a repeated get_lock returns the same id';
    isa_ok $a->{obj}, $CLASS;
    my @h = holders('ipc-one');
    is scalar @h, 1, 'one holder on the server';
    is $h[0]{grant}{metadata}{proc_info}, 'worker a', 'proc_info kept as metadata';
    is $h[0]{grant}{metadata}{pid}, $$, '... with the pid';
    is $h[0]{grant}{slot}, 1, 'slot 1';
    like $a->{obj}->fencing_token, qr/^\d+$/, 'a fencing token';
    is get_lock($b), undef, 'no second lock while the first is held: new returned undef';
    ok release_lock($a), 'release_lock drops the object';
    is scalar(holders('ipc-one')), 0, 'released on the server when the object went';
    is get_lock($b), 1, 'the other process gets id 1 now';
    undef $b;
    is scalar(holders('ipc-one')), 0, 'released when the limit went out of scope';
};

subtest 'max_procs 3: ids 1..3, the lowest free id reused' => sub {
    my @l = map { limit_new(@common, key_name => 'ipc-three', max_procs => 3) } 1 .. 5;
    is_deeply [ map { get_lock($l[$_]) } 0 .. 2 ], [ 1, 2, 3 ], 'ids 1, 2, 3';
    is get_lock($l[3]), undef, 'a fourth is refused';
    release_lock($l[1]);
    is get_lock($l[3]), 2, 'the freed id 2 is taken again';
    is get_lock($l[4]), undef, 'full again';
    release_lock($_) for @l;
    is scalar(holders('ipc-three')), 0, 'all released';
};

subtest 'the options hash is left as it was' => sub {
    my $opt = { max_procs => 2, key_name => 'ipc-opts', endpoint => $endpoint, proc_info => 'p' };
    my %copy = %$opt;
    my $lock = $CLASS->new($opt);
    ok $lock, 'locked';
    is_deeply $opt, \%copy, 'not changed';
};

subtest 'heartbeat extends the lease and detects a lost lock' => sub {
    my $l = limit_new(@common, key_name => 'ipc-beat', ttl_ms => 600);
    is get_lock($l), 1, 'locked with a 600 ms lease';
    my $until = Time::HiRes::time() + 1.5;
    my $beats = 0;
    while (Time::HiRes::time() < $until) {
        heartbeat($l) or last;
        $beats++;
        Time::HiRes::sleep(0.15);
    }
    ok $l->{obj}, "held through 1.5 s ($beats heartbeats)";
    is get_lock(limit_new(@common, key_name => 'ipc-beat')), undef, 'still taken for others';
    $admin->clear;
    ok !heartbeat($l), 'after an admin clear the heartbeat is false';
    ok !$l->{obj}, '... and the limit dropped the lock';

    my $obj = $CLASS->new({ @common, max_procs => 1, key_name => 'ipc-beat', ttl_ms => 300 });
    Time::HiRes::sleep(0.45);
    ok !$obj->heartbeat, 'heartbeat after the lease ran out: false';
    ok $obj->lost, 'lost';
    like $obj->lost_reason, qr/lease ran out/, 'reason: ' . $obj->lost_reason;
};

subtest 'bad input: clear errors' => sub {
    my $e = error_of { $CLASS->new({ @common, max_procs => 0, key_name => 'x' }) };
    like $e, qr/^max_procs must be a whole number of at least 1/, 'max_procs 0';
    $e = error_of { $CLASS->new({ @common, max_procs => 'two', key_name => 'x' }) };
    like $e, qr/^max_procs .*'two'/, 'max_procs not a number';
    $e = error_of { $CLASS->new({ @common, max_procs => 1, key_name => '' }) };
    like $e, qr/^key_name is required/, 'empty key_name';
    $e = error_of { $CLASS->new({ @common, max_procs => 1 }) };
    like $e, qr/^key_name is required/, 'no key_name';
    $e = error_of { $CLASS->new({ @common, max_procs => 1, key_name => 'x', ttl_ms => 0 }) };
    like $e, qr/^ttl_ms must be/, 'ttl_ms 0';
    $e = error_of { $CLASS->new('max_procs') };
    like $e, qr/needs a hash of options/, 'not a hash';

    my $port = TumblerTestServer::free_port();
    my $t0 = Time::HiRes::time();
    $e = error_of { $CLASS->new({ max_procs => 1, key_name => 'x', endpoint => "http://127.0.0.1:$port", timeout => 0.5 }) };
    ok blessed $e && $e->isa('Tumbler::Error::Unavailable'), 'unreachable server: Tumbler::Error::Unavailable, not undef';
    like "$e", qr/unavailable.*no answer within/, "says so: $e";
    cmp_ok Time::HiRes::time() - $t0, '<', 2, 'within the timeout';

    my $held = $CLASS->new({ @common, max_procs => 1, key_name => 'ipc-limit' });
    $e = error_of { $CLASS->new({ @common, max_procs => 2, key_name => 'ipc-limit' }) };
    ok blessed $e && $e->isa('Tumbler::Error::FailedPrecondition') && $e->kind eq 'failed_precondition',
        'another max_procs for a held lock is refused: failed_precondition';
    ok $e->isa('Tumbler::Error::InvalidArgument'), '... still a caller error (InvalidArgument)';
    like $e && $e->message, qr/limit/, '... naming the limit: ' . ($e && $e->message);
};

subtest 'a forked child does not release the parent\'s slot' => sub {
    my $l = limit_new(@common, key_name => 'ipc-fork');
    is get_lock($l), 1, 'locked';
    my $pid = fork // die "fork: $!";
    if (!$pid) {   # the child drops its copy of the object, and leaves without END blocks
        $l->{obj} = undef;
        POSIX::_exit(0);
    }
    waitpid $pid, 0;
    is scalar(holders('ipc-fork')), 1, 'still held after the child exited';
    release_lock($l);
    is scalar(holders('ipc-fork')), 0, 'released by the parent';
};

subtest 'a SIGKILLed process does not leak its slot: the lease ends' => sub {
    my $ttl = 1000;
    pipe my $r, my $w or die "pipe: $!";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        close $r;
        my @inc = map { "-I$_" } grep { !ref } @INC;
        open STDOUT, '>&', $w or POSIX::_exit(127);
        { exec $^X, @inc, '-MIPC::ConcurrencyLimit::Lock::Tumbler', '-e', q{
            $| = 1;
            my $l = IPC::ConcurrencyLimit::Lock::Tumbler->new(
                { max_procs => 1, key_name => 'ipc-kill', endpoint => $ARGV[0], ttl_ms => $ARGV[1] });
            print $l ? "held " . $l->id . "\n" : "refused\n";
            while (1) { $l->heartbeat or die "lost\n"; select undef, undef, undef, 0.1 }
        }, $endpoint, $ttl }
        POSIX::_exit(127);
    }
    close $w;
    my $line = <$r>;
    is $line, "held 1\n", 'the child perl holds slot 1';
    Time::HiRes::sleep(1.5);
    is get_lock(limit_new(@common, key_name => 'ipc-kill')), undef,
        "still held 1.5 s into a $ttl ms lease (its heartbeat renews it)";
    kill 'KILL', $pid;
    waitpid $pid, 0;
    my $killed = Time::HiRes::time();
    my $l = limit_new(@common, key_name => 'ipc-kill');
    my $id;
    until (($id = get_lock($l)) || Time::HiRes::time() - $killed > 5) { Time::HiRes::sleep(0.02) }
    my $freed = int((Time::HiRes::time() - $killed) * 1000);
    is $id, 1, "slot 1 free again $freed ms after kill -9";
    cmp_ok $freed, '<=', $ttl + 500, 'within the lease (plus a little)';
};

done_testing;
