use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use IO::Select;
use IO::Socket::INET;
use POSIX ();
use Scalar::Util qw(blessed);
use Time::HiRes ();
use Tumbler::Client;
use TumblerTestServer;

# A lock's lease is counted from what the server answered, never from when
# the answer arrived: its local end is never later than the server's.
my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }
my $direct = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);
my %proxies;   # pid => 1: stopped at the end, whatever happens
END { stop_proxy($_) for keys %proxies }

# A TCP proxy in a child process, on loopback, in front of the server. The
# first connection's request goes through and is answered by the server;
# the proxy holds that answer for $hold seconds, then either delivers it
# ('late') or closes the connection without it ('drop'), so the client
# retries. Later connections are relayed as they are.
sub proxy {
    my ($mode, $hold) = @_;
    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
        or die "listen: $!";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        my $first = 1;
        while (my $c = $listen->accept) {
            my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $server->{port}) or last;
            if ($first) {
                $first = 0;
                my $request = '';
                $request .= _read($c) until _whole($request);
                syswrite $s, $request;
                my $answer = _read($s);
                Time::HiRes::sleep($hold);
                if ($mode eq 'drop') { close $c; close $s; next }
                syswrite $c, $answer;
            }
            _relay($c, $s);
        }
        POSIX::_exit(0);
    }
    $proxies{$pid} = 1;
    my $port = $listen->sockport;
    close $listen;
    return ("http://127.0.0.1:$port", $pid);
}

sub _read {
    my $fh = shift;
    IO::Select->new($fh)->can_read(10) or die "proxy: nothing to read\n";
    sysread($fh, my $buf, 65536) or die "proxy: closed\n";
    return $buf;
}

# A whole HTTP request: its head and as much body as it announces.
sub _whole {
    my $request = shift;
    my $end = index($request, "\r\n\r\n");
    return 0 if $end < 0;
    my ($length) = substr($request, 0, $end) =~ /^content-length:\s*(\d+)/mi;
    return length($request) >= $end + 4 + ($length // 0);
}

sub _relay {
    my ($c, $s) = @_;
    my $sel = IO::Select->new($c, $s);
    while (my @ready = $sel->can_read(30)) {
        for my $fh (@ready) {
            sysread($fh, my $buf, 65536) or return;
            syswrite($fh == $c ? $s : $c, $buf);
        }
    }
}

sub stop_proxy { my $pid = shift; delete $proxies{$pid} or return; kill 'TERM', $pid; waitpid $pid, 0 }

# What the server says is left of the lock's lease, then the lock's own
# count, read after it: the local count must not be longer.
sub server_left {
    my ($lock) = @_;
    my ($h) = grep { $_->{grant}{holder} eq $lock->holder } @{ $direct->inspect($lock->name)->{holders} // [] };
    return $h ? $h->{remaining_ms} / 1000 : 0;
}

sub no_later_than_server {
    my ($lock, $what) = @_;
    my $server = server_left($lock);
    my $local = $lock->remaining;
    cmp_ok $local, '<=', $server, sprintf('%s: the local lease end is no later than the server\'s (%.3f s left, server %.3f s)',
        $what, $local, $server);
}

subtest 'a retry after a lost answer (ALREADY_HELD): the lease from the first request\'s start' => sub {
    my ($endpoint, $pid) = proxy(drop => 1.5);
    my $client = Tumbler::Client->new(endpoint => $endpoint, timeout => 10, backoff => 0.01);
    my $lock = $client->lock('retried', ttl_ms => 3000);
    is $lock->grant->{status}, 'already_held', 'the answer was lost and the retry found the grant';
    no_later_than_server($lock, 'after the retry');
    ok !$lock->lost, 'held while the lease lasts';

    # Until the server's lease ends, then another holder takes the lock.
    Time::HiRes::sleep(0.05) while server_left($lock) > 0;
    my $next = $direct->acquire('retried', ttl_ms => 10_000);
    is $next->{status}, 'acquired', 'the server gave the lock to another holder';
    ok $lock->lost, 'lost says lost';
    my $e = eval { $lock->check; 1 } ? undef : $@;
    ok blessed($e) && $e->isa('Tumbler::Error::LockLost'), 'check dies LockLost';
    ok !$lock->heartbeat, 'heartbeat says lost';
    $direct->release('retried', holder => $next->{holder});
    undef $lock;
    stop_proxy($pid);
};

subtest 'an answer that comes late (ACQUIRED): the lease from the request\'s start' => sub {
    my ($endpoint, $pid) = proxy(late => 1);
    my $client = Tumbler::Client->new(endpoint => $endpoint, timeout => 10);
    my $lock = $client->lock('late', ttl_ms => 3000);
    is $lock->grant->{status}, 'acquired', 'acquired, the answer a second late';
    no_later_than_server($lock, 'after a late answer');
    cmp_ok $lock->remaining, '>', 1, 'the lease is still counted (a second of it went by)';
    ok $lock->release, 'released';
    stop_proxy($pid);
};

subtest 'a holder passed in that already held the lock: renewed, then counted' => sub {
    my $g = $direct->acquire('passed', ttl_ms => 3000);
    Time::HiRes::sleep(1);
    my $lock = $direct->lock('passed', holder => $g->{holder}, ttl_ms => 3000);
    is $lock->grant->{status}, 'already_held', 'already held';
    is $lock->fencing_token, $g->{fencing_token}, 'the same grant';
    no_later_than_server($lock, 'the old grant');
    cmp_ok server_left($lock), '>', 2.5, 'its lease renewed on the server';
    ok $lock->release, 'released';
};

subtest 'a downgrade keeps the lease it had' => sub {
    my $lock = $direct->lock('downgraded', mode => 'write', ttl_ms => 3000);
    Time::HiRes::sleep(1);
    $lock->downgrade;
    is $lock->mode, 'read', 'downgraded';
    no_later_than_server($lock, 'after the downgrade');
    ok $lock->release, 'released';
};

subtest 'a leadership: counted from the campaign\'s start; a candidate passed in that leads: renewed' => sub {
    my $l = $direct->campaign('elected', ttl_ms => 3000);
    no_later_than_server($l, 'a new term');
    Time::HiRes::sleep(1);
    my $again = $direct->campaign('elected', candidate => $l->candidate, ttl_ms => 3000);
    is $again->term, $l->term, 'the same term';
    no_later_than_server($again, 'the term it had');
    cmp_ok server_left($again), '>', 2.5, 'its lease renewed on the server';
    # Only the first campaign was told the secret: it resigns the term.
    $again->{released} = 1;
    ok $l->resign, 'resigned';
};

done_testing;
