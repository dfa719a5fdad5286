#!/usr/bin/env perl
# Perl seed pattern of clients/perl/README.md, run by the conformance driver:
# IPC::ConcurrencyLimit's interface (Tumbler::ConcurrencyLimit, and the lock
# class IPC::ConcurrencyLimit::Lock::Tumbler as IPC::ConcurrencyLimit calls
# it): max_procs slots numbered 1.., heartbeat, release on destruction, and
# a killed process's slot freed when its lease ends; and one leader among
# replicas (leader election).
#
# usage: examples.pl ADDR NAMESPACE all
use strict;
use warnings;
use JSON::PP ();
use POSIX ();
use Time::HiRes ();
use IPC::ConcurrencyLimit::Lock::Tumbler;
use Tumbler::Client;
use Tumbler::ConcurrencyLimit;

my ($addr, $namespace, $cmd) = @ARGV;
die "usage: $0 ADDR NAMESPACE all\n" unless defined $cmd && $cmd eq 'all';
my $endpoint = "http://$addr";
my @opts = (endpoint => $endpoint, namespace => $namespace, timeout => 5);
my $admin = Tumbler::Client->new(@opts);

my @checks;
sub check { my ($what, $ok, $detail) = @_; push @checks, { what => $what, ok => $ok ? JSON::PP::true : JSON::PP::false,
    (defined $detail ? (detail => $detail) : ()) } }

{
    my @workers = map { Tumbler::ConcurrencyLimit->new(@opts, key_name => 'pl-cron', max_procs => 2,
        proc_info => "worker $_") } 1 .. 3;
    my @ids = map { $_->get_lock } @workers;
    check('concurrency limit: max_procs 2 gives lock ids 1 and 2, a third process gets undef',
        ($ids[0] // 0) == 1 && ($ids[1] // 0) == 2 && !defined $ids[2], [ @ids ]);
    check('concurrency limit: heartbeat true while the slot is held', $workers[0]->heartbeat);
    $workers[0]->release_lock;
    check('concurrency limit: a released id is taken again', ($workers[2]->get_lock // 0) == 1);
    my ($h) = grep { $_->{grant}{slot} == 2 } @{ $admin->inspect('pl-cron')->{holders} // [] };
    check('concurrency limit: proc_info is kept as metadata', $h && $h->{grant}{metadata}{proc_info} eq 'worker 2');
    # An admin takes slot 2 away: its holder's next heartbeat says so.
    $admin->release('pl-cron', holder => $h->{grant}{holder}, fencing_token => $h->{grant}{fencing_token});
    check('concurrency limit: heartbeat false once the slot was taken away; the lock is dropped',
        !$workers[1]->heartbeat && !$workers[1]->is_locked);
    undef @workers;
    check('concurrency limit: slots released when the objects go', !@{ $admin->inspect('pl-cron')->{holders} // [] });
}

{   # IPC::ConcurrencyLimit's get_lock: CLASS->new({ max_procs => 1, %options }), undef when full.
    my $class = 'IPC::ConcurrencyLimit::Lock::Tumbler';
    my $a = $class->new({ max_procs => 1, @opts, key_name => 'pl-ipc' });
    my $b = $class->new({ max_procs => 1, @opts, key_name => 'pl-ipc' });
    check('IPC::ConcurrencyLimit lock class: id 1, and undef for a second process', $a && $a->id == 1 && !defined $b);
    undef $a;
    check('IPC::ConcurrencyLimit lock class: released on destruction',
        !@{ $admin->inspect('pl-ipc')->{holders} // [] });
}

{   # The seed's warning: a process that dies without its destructor leaked its slot. Here the lease ends.
    my $ttl = 1000;
    pipe my $r, my $w or die "pipe: $!";
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        close $r;
        open STDOUT, '>&', $w or POSIX::_exit(127);
        { exec $^X, (map { "-I$_" } grep { !ref } @INC), '-MTumbler::ConcurrencyLimit', '-e', q{
            $| = 1;
            my $l = Tumbler::ConcurrencyLimit->new(endpoint => $ARGV[0], namespace => $ARGV[1],
                key_name => 'pl-killed', ttl_ms => $ARGV[2]);
            print(($l->get_lock // 0), "\n");
            while (1) { $l->heartbeat or exit 1; select undef, undef, undef, 0.1 }
        }, $endpoint, $namespace, $ttl }
        POSIX::_exit(127);
    }
    close $w;
    my $id = <$r>;
    chomp $id if defined $id;
    Time::HiRes::sleep(1.2);
    my $probe = Tumbler::ConcurrencyLimit->new(@opts, key_name => 'pl-killed');
    my $busy = !defined $probe->get_lock;
    kill 'KILL', $pid;
    waitpid $pid, 0;
    my $killed = Time::HiRes::time();
    my $got;
    until (($got = $probe->get_lock) || Time::HiRes::time() - $killed > 5) { Time::HiRes::sleep(0.02) }
    my $freed = int((Time::HiRes::time() - $killed) * 1000);
    check("a kill -9'd process's slot: held past its $ttl ms lease while alive, free $freed ms after the kill",
        ($id // '') eq '1' && $busy && ($got // 0) == 1 && $freed <= $ttl + 500,
        { child_id => $id, busy_while_alive => $busy ? 1 : 0, freed_ms => $freed });
}

# Runs $work->($leadership) while this replica leads $election; undef when
# another one led for the whole wait. The value others see is this
# replica's address. The work calls $leadership->heartbeat from its loop
# (more often than a third of ttl_ms): false once the term ended under it.
sub run_as_leader {
    my ($client, $election, $me, $work) = @_;
    my $leadership = $client->campaign($election, value => $me, wait_ms => 5_000, ttl_ms => 3_000)
        or return undef;
    my @result = $work->($leadership);
    $leadership->resign;   # the next replica in line is elected at once (leaving the scope does too)
    return $result[0];
}

{
    my $term = run_as_leader($admin, 'pl.scheduler', '10.0.0.7:8080', sub {
        my $leadership = shift;
        my $now = $admin->leader('pl.scheduler');
        check("leader election: leader() shows this replica's value and term",
            $now && $now->{value} eq '10.0.0.7:8080' && $now->{term} == $leadership->term);
        my $other = Tumbler::Client->new(@opts)->campaign('pl.scheduler', value => '10.0.0.8:8080');
        check('leader election: another replica is not elected while this one leads', !defined $other);
        my $first;
        $admin->observe('pl.scheduler', sub { $first = shift; 0 });   # false: stop after the first
        check('leader election: observe starts with the current leader',
            $first && $first->{event} eq 'current' && $first->{leader}{term} == $leadership->term);
        check('leader election: heartbeat keeps the leadership', $leadership->heartbeat(force => 1));
        $leadership->proclaim('10.0.0.7:9090');
        return $leadership->term;
    });
    check('leader election: elected, with a term (fencing token)', $term && $term > 0);
    check('leader election: nobody leads after resign', !defined $admin->leader('pl.scheduler'));
}

{   # A big export takes 3 of 10 permits, small ones share the rest; 11 of 10 is refused naming permits.
    my $big = $admin->lock('pl-exports', limit => 10, permits => 3, ttl_ms => 5_000);
    check('weighted permits: a big job holds 3 of 10, one slot per permit',
        $big->permits == 3 && "@{[ $big->slots ]}" eq '1 2 3', [ $big->slots ]);
    my @small = map { $admin->lock('pl-exports', limit => 10, ttl_ms => 5_000) } 1 .. 7;
    check('weighted permits: seven small jobs take the other slots, 4..10',
        join(' ', sort { $a <=> $b } map { $_->slot } @small) eq '4 5 6 7 8 9 10'
            && !grep { $_->permits != 1 } @small);
    check('weighted permits: inspect counts 10 permits in use',
        $admin->inspect('pl-exports')->{permits_in_use} == 10);
    check('weighted permits: an 11th permit is busy',
        !eval { $admin->acquire('pl-exports', limit => 10); 1 } && $@->isa('Tumbler::Error::NotAcquired'));
    check('weighted permits: extended, the big job keeps its 3 slots', "@{[ $big->extend->slots ]}" eq '1 2 3');
    my $refused = eval { $admin->acquire('pl-exports', limit => 10, permits => 11); 1 } ? undef : $@;
    check('weighted permits: 11 of 10 dies Tumbler::Error::InvalidArgument with the server\'s message',
        $refused && $refused->isa('Tumbler::Error::InvalidArgument') && $refused->message =~ /^permits/,
        $refused && $refused->message);
}   # every guard releases here

print JSON::PP->new->canonical->encode({ checks => \@checks }), "\n";
