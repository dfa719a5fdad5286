package Tumbler::Client;
use strict;
use warnings;
use Carp ();
use HTTP::Tiny;
use JSON::PP ();
use Socket ();
use Sys::Hostname ();
use Time::HiRes ();
use Tumbler::Error;
use Tumbler::Lock;
use Tumbler::LockSet;
use Tumbler::Leadership;

our $VERSION = '0.1.0';

# JSON: Cpanel::JSON::XS or JSON::XS when installed (Debian
# libcpanel-json-xs-perl, libjson-xs-perl), else the core JSON::PP, which
# is pure Perl and most of a call's own time. All three give the same
# text for what the client sends (UTF-8, keys sorted, JSON::PP's booleans)
# and the same data back (JSON::PP::Boolean for true and false).
# TUMBLER_JSON_PP=1 keeps JSON::PP.
our $JSON_CLASS = 'JSON::PP';
unless ($ENV{TUMBLER_JSON_PP}) {
    for my $xs ('Cpanel::JSON::XS', 'JSON::XS') { if (eval "require $xs; 1") { $JSON_CLASS = $xs; last } }
}
my $JSON = $JSON_CLASS->new->utf8->canonical;

sub _now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

# Request options: the Perl name, the proto3 JSON name, and how it is sent.
# 64-bit integers go as JSON strings (proto3 JSON), 32-bit ones as numbers.
my %FIELDS = (
    holder        => [ holder       => 'str' ],
    ttl_ms        => [ ttlMs        => 'u64' ],
    wait_ms       => [ waitMs       => 'u64' ],
    queue_ttl_ms  => [ queueTtlMs   => 'u64' ],
    limit         => [ limit        => 'u32' ],
    kind          => [ kind         => 'str' ],
    metadata      => [ metadata     => 'map' ],
    priority      => [ priority     => 'i32' ],
    fair          => [ fair         => 'bool' ],
    mode          => [ mode         => 'mode' ],
    prefer_readers => [ preferReaders => 'bool' ],
    permits       => [ permits      => 'u32' ],
    fencing_token => [ fencingToken => 'u64' ],
    fencing_tokens => [ fencingTokens => 'u64s' ],
    max_entries   => [ maxEntries   => 'u32' ],
    prefix        => [ prefix       => 'str' ],
    page_size     => [ pageSize     => 'u32' ],
    page_token    => [ pageToken    => 'str' ],
    only_waiting  => [ onlyWaiting  => 'bool' ],
    older_than_ms => [ olderThanMs  => 'u64' ],
    from_ms       => [ fromMs       => 'u64' ],
    to_ms         => [ toMs         => 'u64' ],
    namespace     => [ namespace    => 'str' ],
    candidate     => [ candidate    => 'str' ],
    value         => [ value        => 'str' ],
    term          => [ term         => 'u64' ],
    secret        => [ secret       => 'str' ],
);

# A read/write lock's mode: read (shared) or write (alone), as the API names them.
my %MODE = (read => 'LOCK_MODE_READ', write => 'LOCK_MODE_WRITE',
            lock_mode_read => 'LOCK_MODE_READ', lock_mode_write => 'LOCK_MODE_WRITE');

my %ALLOWED = (
    Acquire => [qw(namespace holder ttl_ms wait_ms queue_ttl_ms limit kind metadata priority fair mode prefer_readers
                   permits)],
    Release => [qw(namespace holder fencing_token fencing_tokens)],
    Extend  => [qw(namespace holder ttl_ms fencing_token fencing_tokens)],
    Inspect => [qw(namespace)],
    Queue   => [qw(namespace max_entries)],
    List    => [qw(namespace prefix page_size page_token only_waiting)],
    Reap    => [qw(namespace older_than_ms)],
    Clear   => [qw(namespace)],
    Metrics => [qw(namespace from_ms to_ms kind)],
    Campaign => [qw(namespace candidate value ttl_ms wait_ms queue_ttl_ms kind secret)],
    Proclaim => [qw(namespace candidate term value secret)],
    Resign   => [qw(namespace candidate term secret)],
    Leader   => [qw(namespace)],
    Observe  => [qw(namespace)],
);

sub new {
    my ($class, %args) = @_;
    my $self = bless {
        endpoint    => 'http://127.0.0.1:50051',
        token       => undef,
        namespace   => undef,
        timeout     => 10,      # seconds: each call's deadline, retries included
        backoff     => 0.05,    # first retry pause, doubled up to max_backoff
        max_backoff => 1,
        ca_file     => undef,   # https: the CAs to verify the server with (default: the system's)
        ssl_options => {},      # https: more IO::Socket::SSL options (a client certificate, ...)
        %args,
    }, $class;
    $self->{endpoint} =~ s{/+$}{};
    $self->{endpoint} = "http://$self->{endpoint}" unless $self->{endpoint} =~ m{^https?://};
    if ($self->{endpoint} =~ m{^https://}) {
        _check_tls($self);
        $self->{http} = $self->_http(keep_alive => 1, timeout => $self->{timeout});
    } else {
        $self->{wire} = Tumbler::Client::Wire->new($self->{endpoint}, $self->{token});
    }
    return $self;
}

# An https endpoint needs the modules HTTP::Tiny speaks TLS with, and a
# readable CA file when one is given: said here, not as an unavailable
# server at the first call.
sub _check_tls {
    my $self = shift;
    my @missing = grep { my ($m, $v) = @$_; !eval "require $m; $m->VERSION($v); 1" }
        [ 'IO::Socket::SSL', '1.42' ], [ 'Net::SSLeay', '1.49' ];
    Carp::croak("$self->{endpoint}: https needs "
            . join(' and ', map { "$_->[0] $_->[1] or later" } @missing)
            . ', not installed (Debian: libio-socket-ssl-perl libnet-ssleay-perl; CPAN: IO::Socket::SSL)')
        if @missing;
    Carp::croak("ca_file '$self->{ca_file}' is not a readable file")
        if defined $self->{ca_file} && !(-f $self->{ca_file} && -r _);
}

# The HTTP client of the calls (kept alive) and of observe streams (one
# connection each). TLS certificates are always verified, against ca_file
# or the system's CAs (HTTP::Tiny's own default is not to verify). An
# endpoint named by its IP address sends no SNI (RFC 6066 has no IP
# addresses in it; the certificate is still checked for the address).
sub _http {
    my ($self, %args) = @_;
    my $by_ip = $self->{endpoint} =~ m{^https://(?:[0-9.]+|\[[0-9A-Fa-f:.]+\])(?:[:/]|$)};
    return Tumbler::Client::HTTP->new(
        agent       => "tumbler-perl/$VERSION ",
        verify_SSL  => 1,
        SSL_options => {
            ($by_ip ? (SSL_hostname => '') : ()),
            %{ $self->{ssl_options} },
            (defined $self->{ca_file} ? (SSL_ca_file => $self->{ca_file}) : ()),
        },
        %args,
    );
}

sub endpoint  { $_[0]{endpoint} }
sub namespace { $_[0]{namespace} }

# A holder id made here, so that a retried Acquire is the same request.
my $seq = 0;
sub new_holder {
    my $host = Sys::Hostname::hostname() // 'perl';
    $host =~ s/[^A-Za-z0-9_.-]/_/g;
    return sprintf '%s-%d-%08x%08x-%d', $host, $$, int(rand(2**32)), int(rand(2**32)), ++$seq;
}

my %IS_ALLOWED = map { my $m = $_; ($m => { map { $_ => 1 } @{ $ALLOWED{$m} } }) } keys %ALLOWED;

sub _body {
    my ($self, $method, $fixed, $opts) = @_;
    my %body = %$fixed;
    my $allowed = $IS_ALLOWED{$method};
    my $ns = exists $opts->{namespace} ? $opts->{namespace} : $self->{namespace};
    $body{namespace} = $ns if defined $ns;
    for my $key (sort keys %$opts) {
        next if $key eq 'namespace' || $key eq 'timeout';
        Tumbler::Error::InvalidArgument->throw(
            code => 'invalid_argument', kind => 'invalid_argument', method => $method,
            message => "$key: unknown option for " . lc($method),
        ) unless $allowed->{$key};
        my $v = $opts->{$key};
        next unless defined $v;
        my ($json, $type) = @{ $FIELDS{$key} };
        if    ($type eq 'u64') { $body{$json} = "$v" }
        elsif ($type eq 'u64s') {
            Tumbler::Error::InvalidArgument->throw(
                code => 'invalid_argument', kind => 'invalid_argument', method => $method,
                message => "$key: an array ref of fencing tokens, one per name",
            ) unless ref $v eq 'ARRAY';
            $body{$json} = [ map { "$_" } @$v ];
        }
        elsif ($type eq 'u32' || $type eq 'i32') { $body{$json} = $v =~ /^-?\d+$/ ? 0 + $v : "$v" }
        elsif ($type eq 'bool') { $body{$json} = $v ? JSON::PP::true : JSON::PP::false }
        elsif ($type eq 'mode') {
            my $mode = $MODE{lc $v};
            Tumbler::Error::InvalidArgument->throw(
                code => 'invalid_argument', kind => 'invalid_argument', method => $method,
                message => "mode: '$v' is not read or write",
            ) unless $mode;
            $body{$json} = $mode;
        }
        elsif ($type eq 'map') { $body{$json} = { map { $_ => "$v->{$_}" } keys %$v } }
        else { $body{$json} = "$v" }
    }
    return \%body;
}

# One Connect unary call, retried while the server is unavailable (nothing
# listening, a broken connection, 503 unavailable) until the deadline.
sub call {
    my ($self, $method, $body, %args) = @_;
    my $timeout  = $args{timeout} // $self->{timeout};
    my $deadline = _now() + $timeout;
    my $content  = $JSON->encode($body // {});
    my $wire     = $self->{wire};
    my ($url, %headers);
    unless ($wire) {
        $url = "$self->{endpoint}/tumbler.v1.LockService/$method";
        %headers = ('content-type' => 'application/json', accept => 'application/json');
        $headers{authorization} = "Bearer $self->{token}" if defined $self->{token};
    }
    my $pause = $self->{backoff};
    my ($attempts, $last) = (0, '');
    while (1) {
        my $left = $deadline - _now();
        last if $left <= 0 && $attempts > 0;
        $left = 0.001 if $left <= 0;
        $attempts++;
        my $res = $wire
            ? _interruptible(sub { $wire->post($method, $content, $left) })
            : _interruptible(sub {
                $self->{http}->timeout($left);
                $self->{http}->request(POST => $url, {
                    headers => { %headers, 'connect-timeout-ms' => int($left * 1000) || 1 },
                    content => $content,
                });
            });
        my $status = $res->{status};
        if ($status == 200) {
            my $out = eval { $JSON->decode(length $res->{content} ? $res->{content} : '{}') };
            return $out if ref $out eq 'HASH';
            die Tumbler::Error->new(kind => 'internal', code => 'internal', method => $method,
                http_status => 200, message => "answer is not JSON: " . substr($res->{content}, 0, 200));
        }
        my ($code, $message);
        if ($status == 599) {   # HTTP::Tiny: no answer (refused, reset, timed out)
            ($code, $message) = ('unavailable', $res->{content});
            $message =~ s/\s+$//;
            _tls_refused($method, $message, $attempts);
        } else {
            my $err = eval { $JSON->decode($res->{content}) };
            if (ref $err eq 'HASH' && defined $err->{code}) {
                ($code, $message) = ($err->{code}, $err->{message} // '');
            } else {
                $message = "HTTP $status $res->{reason}";
            }
        }
        my $e = Tumbler::Error->from_connect(
            code => $code, message => $message, http_status => $status, method => $method,
            attempts => $attempts,
        );
        die $e unless $e->kind eq 'unavailable';
        $last = $message;
        $left = $deadline - _now();
        last if $left <= 0;
        my $sleep = $pause * (0.5 + rand(0.5));
        $sleep = $left if $sleep > $left;
        Time::HiRes::sleep($sleep);
        $pause *= 2;
        $pause = $self->{max_backoff} if $pause > $self->{max_backoff};
    }
    die Tumbler::Error::Unavailable->new(
        kind => 'unavailable', code => 'unavailable', method => $method, attempts => $attempts,
        message => sprintf('no answer within %.3gs after %d attempts: %s', $timeout, $attempts, $last),
    );
}

# A server whose certificate does not verify is not a server that is
# down: no retry would change that, so the call ends at once.
sub _tls_refused {
    my ($method, $message, $attempts) = @_;
    return unless $message =~ /certificate verify failed|hostname verification failed|SSL_ca_file|CA bundle/i;
    die Tumbler::Error::TLS->new(kind => 'tls', code => 'unavailable', method => $method,
        attempts => $attempts, message => "the server's certificate did not verify, nothing was sent: $message");
}

# HTTP::Tiny turns every exception inside a request into a 599 answer, which
# call() would retry. A die from a signal handler (alarm, SIGTERM, ...) is
# the caller stopping the call: the handlers are wrapped for the request so
# that such an exception leaves call() as it was thrown. The request's
# socket is closed as the exception unwinds, so the server drops a waiting
# Acquire at once.
my @INTERRUPTS = qw(ALRM INT TERM HUP QUIT USR1 USR2);

sub _interruptible {
    my $request = shift;
    my @mine = grep { ref $SIG{$_} eq 'CODE' } @INTERRUPTS;
    return $request->() unless @mine;
    my $thrown;
    local @SIG{@mine} = map {
        my $handler = $SIG{$_};
        sub {
            return if eval { $handler->(@_); 1 };
            $thrown = [$@];
            die { status => 599, reason => 'Interrupted', content => '', headers => {} };
        };
    } @mine;
    my $res = $request->();
    die $thrown->[0] if $thrown;
    return $res;
}

# proto3 JSON names to Perl ones (fencingToken -> fencing_token); map
# values such as metadata keep their keys. The few names the API has are
# converted once.
my %SNAKE;
sub _snake {
    my ($v, $keep) = @_;
    if (ref $v eq 'HASH') {
        return { %$v } if $keep;
        my %out;
        for my $k (keys %$v) {
            my $s = $SNAKE{$k} // do {
                (my $s = $k) =~ s/([A-Z])/_\l$1/g;
                $SNAKE{$k} = $s if keys %SNAKE < 512;   # names, not map keys without end
                $s;
            };
            my $x = $v->{$k};
            $out{$s} = ref $x ? _snake($x, $k eq 'metadata') : $x;
        }
        return \%out;
    }
    return [ map { _snake($_) } @$v ] if ref $v eq 'ARRAY';
    return $v;
}

# A grant's LOCK_MODE_READ / LOCK_MODE_WRITE as read / write; undef for a
# plain lock's (the field is left out).
sub _mode_name {
    my $mode = shift // '';
    return $mode eq 'LOCK_MODE_READ' ? 'read' : $mode eq 'LOCK_MODE_WRITE' ? 'write' : undef;
}

# A grant as the caller sees it: its mode named, its permits (1 unless
# more were asked) and its slots, one per permit (proto3 JSON leaves out
# what is zero or empty).
sub _grant {
    my $grant = shift;
    $grant->{mode} = _mode_name($grant->{mode});
    $grant->{permits} = 0 + ($grant->{permits} || 1);
    $grant->{slots} = [ defined $grant->{slot} ? $grant->{slot} : () ] unless @{ $grant->{slots} // [] };
    return $grant;
}

sub _name {
    my $name = shift;
    Carp::croak('a lock name is required') unless defined $name;
    return $name;
}

# acquire(name, %opts): the grant (holder, fencing_token, slot, expires_at_ms,
# ttl_ms, kind, metadata, status). Dies Tumbler::Error::NotAcquired (kind
# busy, or timeout after wait_ms) when not acquired.
sub acquire {
    my ($self, $name, %opts) = @_;
    my $res = $self->_acquire({ name => _name($name) }, $name, \%opts);
    my $grant = _grant($res->{grant});
    $grant->{status} = $res->{status};
    $grant->{name} = $name;
    $grant->{namespace} = $opts{namespace} // $self->{namespace};
    return $grant;
}

# acquire_all(\@names, %opts): a multi-lock (2 to 16 distinct names of the
# namespace), every lock or none, for one holder with one lease and one
# wait (holder, ttl_ms, wait_ms, queue_ttl_ms, limit, kind, metadata,
# namespace, timeout). While it waits it holds nothing: the server tries
# the whole set again when a lock of it frees. Returns the set as a hash:
# holder, names, status, namespace, grants (one grant hash per name in
# the order asked, each with its name and own fencing_token) and
# fencing_tokens (one per name, in the order of names: what release_all
# and extend_all pin the set to). Dies
# Tumbler::Error::NotAcquired (busy, or timeout; named by the names joined
# with commas), Tumbler::Error::InvalidArgument (fewer than 2 or more than
# 16 names, a name twice: the message starts with "names"),
# Tumbler::Error::Deadlock.
sub acquire_all {
    my ($self, $names, %opts) = @_;
    Carp::croak('acquire_all needs an array ref of names') unless ref $names eq 'ARRAY';
    my @names = map { "$_" } @$names;
    my $res = $self->_acquire({ names => \@names }, join(',', @names), \%opts);
    my @grants = map { _grant($_) } @{ $res->{grants} // [] };
    my %token = map { ($_->{name} => $_->{fencing_token}) } @grants;
    return {
        holder    => $res->{grant}{holder},
        names     => \@names,
        status    => $res->{status},
        namespace => $opts{namespace} // $self->{namespace},
        grants    => \@grants,
        fencing_tokens => [ map { $token{$_} } @names ],
    };
}

# One Acquire ($fixed: its name, or its names) with a holder made here when
# none is given; the answer with its status as acquired or already_held.
# Dies Tumbler::Error::NotAcquired, named $label, when not acquired.
sub _acquire {
    my ($self, $fixed, $label, $opts) = @_;
    $opts->{holder} //= new_holder();
    my $timeout = $opts->{timeout} // $self->{timeout};
    my $wait = ($opts->{wait_ms} // 0) / 1000;
    my $res = _snake($self->call('Acquire', $self->_body('Acquire', $fixed, $opts), timeout => $timeout + $wait));
    my $status = $res->{status} // '';
    if ($status eq 'ACQUIRE_STATUS_ACQUIRED' || $status eq 'ACQUIRE_STATUS_ALREADY_HELD') {
        $res->{status} = $status eq 'ACQUIRE_STATUS_ACQUIRED' ? 'acquired' : 'already_held';
        return $res;
    }
    my $reason = $res->{reason} // '';
    my $kind = $reason eq 'NOT_ACQUIRED_REASON_TIMEOUT' ? 'timeout' : 'busy';
    die Tumbler::Error::NotAcquired->new(
        kind => $kind, code => 'not_acquired', method => 'Acquire', reason => $reason,
        holders => $res->{holders},
        message => "$label: " . ($kind eq 'busy' ? 'held by others' : 'not acquired within wait_ms'),
    );
}

# release(name, holder => ..., fencing_token => ...): true if released,
# false if the holder did not hold it (any more).
sub release {
    my ($self, $name, %opts) = @_;
    return $self->_release({ name => _name($name) }, %opts);
}

# release_all(\@names, holder => ..., fencing_tokens => \@tokens): a
# multi-lock's set released by its holder; true if every lock was held and
# released, false when any was not (the holder's others are released all
# the same). fencing_tokens (one per name, in the order of names) pins each
# lock to its token: a lock taken again since is left alone (false).
sub release_all {
    my ($self, $names, %opts) = @_;
    return $self->_release({ names => [ map { "$_" } @$names ] }, %opts);
}

sub _release {
    my ($self, $fixed, %opts) = @_;
    Carp::croak('release needs holder') unless defined $opts{holder};
    my $res = $self->call('Release', $self->_body('Release', $fixed, \%opts),
        (defined $opts{timeout} ? (timeout => $opts{timeout}) : ()));
    return ($res->{status} // '') eq 'RELEASE_STATUS_RELEASED' ? 1 : 0;
}

# extend(name, holder => ..., ttl_ms => ..., fencing_token => ...): the
# renewed grant; dies Tumbler::Error::NotHeld when it is not held.
sub extend {
    my ($self, $name, %opts) = @_;
    return $self->_extend({ name => _name($name) }, $name, %opts);
}

# extend_all(\@names, holder => ..., ttl_ms => ..., fencing_tokens => \@tokens):
# every lease of the set renewed; the grant whose lease now ends first. Dies
# Tumbler::Error::NotHeld when any lock of it was not held, or (with
# fencing_tokens) carries another token (the holder's others are then
# released, each only where its token matches).
sub extend_all {
    my ($self, $names, %opts) = @_;
    my @names = map { "$_" } @$names;
    return $self->_extend({ names => \@names }, join(',', @names), %opts);
}

sub _extend {
    my ($self, $fixed, $label, %opts) = @_;
    Carp::croak('extend needs holder') unless defined $opts{holder};
    my $res = _snake($self->call('Extend', $self->_body('Extend', $fixed, \%opts),
        (defined $opts{timeout} ? (timeout => $opts{timeout}) : ())));
    if (($res->{status} // '') eq 'EXTEND_STATUS_EXTENDED') {
        return _grant($res->{grant});
    }
    die Tumbler::Error::NotHeld->new(
        kind => 'not_held', code => 'not_held', method => 'Extend',
        message => "$label: not held by $opts{holder}",
    );
}

sub _plain {
    my ($self, $method, $fixed, %opts) = @_;
    return _snake($self->call($method, $self->_body($method, $fixed, \%opts),
        (defined $opts{timeout} ? (timeout => $opts{timeout}) : ())));
}

sub inspect { my ($self, $name, %o) = @_; $self->_plain(Inspect => { name => _name($name) }, %o) }
sub queue   { my ($self, $name, %o) = @_; $self->_plain(Queue   => { name => _name($name) }, %o) }
sub list    { my ($self, %o) = @_; $self->_plain(List    => {}, %o) }
sub reap    { my ($self, %o) = @_; $self->_plain(Reap    => {}, %o) }
sub clear   { my ($self, %o) = @_; $self->_plain(Clear   => {}, %o) }
sub metrics { my ($self, %o) = @_; $self->_plain(Metrics => {}, %o) }

# campaign(name, %opts) (value, candidate, ttl_ms, wait_ms, queue_ttl_ms,
# kind, namespace, timeout): waits up to wait_ms (default 0: try once) in
# the election's queue.
# A Tumbler::Leadership when elected (heartbeat keeps it; resigned when it
# goes out of scope), undef when not elected within the wait. Without a
# candidate the client makes one, so a retried campaign is the same
# candidacy (same term if it already leads).
sub campaign {
    my ($self, $name, %opts) = @_;
    $opts{ttl_ms} //= 15_000;
    $opts{wait_ms} //= 0;   # absent, the server would wait its longest
    my $made_here = !defined $opts{candidate};
    $opts{candidate} //= new_holder();
    my $timeout = $opts{timeout} // $self->{timeout};
    my $wait = ($opts{wait_ms} // 0) / 1000;
    my $start = _now();
    my $res = _snake($self->call('Campaign', $self->_body('Campaign', { name => _name($name) }, \%opts),
        timeout => $timeout + $wait));
    return undef unless $res->{elected};
    return Tumbler::Leadership->_new($self, $name, _leadership($res->{leader}), $opts{namespace} // $self->{namespace},
            $res->{secret} // '')
        ->_count_lease($start, $made_here);
}

# A Leadership message with its numbers as numbers (term and times come as
# proto3 JSON strings) and its empty fields present.
sub _leadership {
    my $l = shift;
    return undef unless $l;
    $l->{$_} //= '' for qw(candidate value namespace name);
    $l->{$_} = 0 + ($l->{$_} // 0) for qw(term elected_at_ms expires_at_ms ttl_ms);
    return $l;
}

# leader(name): the current leadership (candidate, term, value,
# elected_at_ms, expires_at_ms, ttl_ms), undef when nobody leads.
sub leader {
    my ($self, $name, %opts) = @_;
    return _leadership($self->_plain(Leader => { name => _name($name) }, %opts)->{leader});
}

# proclaim(name, candidate => ..., term => ..., secret => ..., value => ...): the
# leadership with its new value; dies Tumbler::Error::NotLeader when the
# candidate does not lead with this term.
sub proclaim {
    my ($self, $name, %opts) = @_;
    my $res = $self->_plain(Proclaim => { name => _name($name) }, %opts);
    return _leadership($res->{leader}) if ($res->{status} // '') eq 'PROCLAIM_STATUS_PROCLAIMED';
    die Tumbler::Error::NotLeader->new(
        kind => 'lost', code => 'not_leader', method => 'Proclaim', reason => 'not the leader',
        message => "$name: " . ($opts{candidate} // '') . " does not lead with term " . ($opts{term} // ''),
    );
}

# resign(name, candidate => ..., term => ..., secret => ...): true if this ended the term,
# false when the candidate did not lead with it.
sub resign {
    my ($self, $name, %opts) = @_;
    my $res = $self->_plain(Resign => { name => _name($name) }, %opts);
    return ($res->{status} // '') eq 'RESIGN_STATUS_RESIGNED' ? 1 : 0;
}

# observe(name, sub { my ($change) = @_; ...; 1 }, %opts): calls the sub
# with each leader change (event, leader or undef, at_ms, ended_term) as
# it happens; the first is the current leader (event "current"). Returns
# when the sub returns false (the stream is closed) and dies with a
# Tumbler::Error when the stream fails. A Connect server stream (one
# HTTP request whose answer is read as it comes); timeout (seconds, default
# a day) bounds how long it waits for the next change.
sub observe {
    my ($self, $name, $on_change, %opts) = @_;
    Carp::croak('observe needs a code ref') unless ref $on_change eq 'CODE';
    my $timeout = $opts{timeout} // 86_400;
    my $body = $JSON->encode($self->_body('Observe', { name => _name($name) }, \%opts));
    my %headers = ('content-type' => 'application/connect+json', 'connect-protocol-version' => '1');
    $headers{authorization} = "Bearer $self->{token}" if defined $self->{token};
    # Its own connection: closed when the stream stops, so the server ends it.
    my $http = $self->_http(keep_alive => 0, timeout => $timeout);
    my ($buf, $stopped, $end) = ('', 0, undef);
    my $res = _interruptible(sub {
        $http->request(POST => "$self->{endpoint}/tumbler.v1.LockService/Observe", {
            headers => \%headers,
            content => pack('CN', 0, length $body) . $body,
            data_callback => sub {
                $buf .= $_[0];
                while (length $buf >= 5) {
                    my ($flags, $len) = unpack 'CN', $buf;
                    last if length $buf < 5 + $len;
                    my $message = substr $buf, 5, $len;
                    substr($buf, 0, 5 + $len) = '';
                    if ($flags & 0x02) {
                        $end = eval { $JSON->decode($message) } // {};
                        next;
                    }
                    my $change = _snake($JSON->decode($message));
                    $change->{event} //= '';
                    $change->{leader} = _leadership($change->{leader});
                    $change->{$_} = 0 + ($change->{$_} // 0) for qw(at_ms ended_term);
                    next if $on_change->($change);
                    $stopped = 1;
                    die "tumbler: observe stopped\n";
                }
            },
        });
    });
    return if $stopped;
    my $status = $res->{status};
    my ($code, $message);
    if ($status == 200) {
        return unless $end && $end->{error};
        ($code, $message) = ($end->{error}{code}, $end->{error}{message} // '');
    } elsif ($status == 599) {
        ($code, $message) = ('unavailable', $res->{content});
        $message =~ s/\s+$//;
        _tls_refused('Observe', $message, 1);
    } else {
        my $err = eval { $JSON->decode($res->{content}) };
        ($code, $message) = ref $err eq 'HASH' ? ($err->{code}, $err->{message} // '') : (undef, "HTTP $status");
    }
    die Tumbler::Error->from_connect(code => $code, message => $message, http_status => $status, method => 'Observe');
}

# lock(name, %acquire_opts): a Tumbler::Lock guard, released when it goes
# out of scope.
sub lock {
    my ($self, $name, %opts) = @_;
    my $start = _now();
    my $grant = $self->acquire($name, %opts);
    my $lock = Tumbler::Lock->_new($self, $name, $grant, $opts{namespace} // $self->{namespace});
    $lock->{limit} = $opts{limit};   # a downgrade asks the same limit
    return $lock->_count_lease($start, !defined $opts{holder});
}

# lock_all(\@names, %acquire_all_opts): a Tumbler::LockSet guard of the
# multi-lock, released (the whole set) when it goes out of scope.
sub lock_all {
    my ($self, $names, %opts) = @_;
    my $start = _now();
    my $set = $self->acquire_all($names, %opts);
    return Tumbler::LockSet->_new_set($self, $set)->_count_lease($start, !defined $opts{holder});
}

# The calls of a plain http endpoint: one kept-alive HTTP/1.1 connection
# of its own, TCP_NODELAY set, each request sent in one write and its
# answer read by Content-Length (chunked and read-to-close answers are read
# too). What HTTP::Tiny does per request besides (its URL parsing, header
# hashes validated and written line by line, head and body in two writes,
# the connection's peer looked up again) was most of a call's time. It
# answers as HTTP::Tiny does (status, reason, headers, content; 599 with
# the message when there was no answer), so call() maps both alike; https
# goes through HTTP::Tiny and IO::Socket::SSL. A reused connection that
# the server closed meanwhile is seen before writing (it is readable) and
# opened again; after a fork the child opens its own.
package Tumbler::Client::Wire;
use Errno ();
use Socket ();

my $SOCKET_CLASS = eval { require IO::Socket::IP; IO::Socket::IP->VERSION(0.32); 'IO::Socket::IP' }
    || do { require IO::Socket::INET; 'IO::Socket::INET' };
my $NOSIGNAL = eval { Socket::MSG_NOSIGNAL() } || 0;

sub new {
    my ($class, $endpoint, $token) = @_;
    my ($host, $port, $path) = $endpoint =~ m{^http://(\[[^\]]+\]|[^:/]+)(?::(\d+))?(/.*)?$}i
        or Carp::croak("endpoint '$endpoint' is not http://host:port");
    $port //= 80;
    (my $bare = $host) =~ s/^\[(.*)\]$/$1/;
    my $head = "Host: $host" . ($port == 80 ? '' : ":$port") . "\r\n"
        . "User-Agent: tumbler-perl/$Tumbler::Client::VERSION\r\n"
        . "Content-Type: application/json\r\nAccept: application/json\r\n"
        . (defined $token ? "Authorization: Bearer $token\r\n" : '');
    return bless { host => $bare, port => $port, prefix => ($path // ''), head => $head, fh => undef }, $class;
}

sub _now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

sub disconnect {
    my $self = shift;
    CORE::close $self->{fh} if $self->{fh} && $self->{pid} == $$;
    $self->{fh} = undef;
}

# Waits until the socket can be read ($write: written) or the deadline; dies
# as HTTP::Tiny does when it passes. A signal whose handler returns is waited
# through.
sub _wait {
    my ($self, $deadline, $write) = @_;
    while (1) {
        my $left = $deadline - _now();
        $left = 0 if $left < 0;
        my $bits = $self->{bits};
        my $n = $write ? select(undef, $bits, undef, $left) : select($bits, undef, undef, $left);
        return 1 if $n > 0;
        next if $n < 0 && $!{EINTR} && $left > 0;
        die 'Timed out while waiting for socket to become ready for ' . ($write ? 'writing' : 'reading') . "\n"
            if $n == 0;
        die "select(2): '$!'\n";
    }
}

sub _connect {
    my ($self, $deadline) = @_;
    my $left = $deadline - _now();
    my $fh = $SOCKET_CLASS->new(PeerHost => $self->{host}, PeerPort => $self->{port}, Proto => 'tcp',
        Type => Socket::SOCK_STREAM(), Timeout => ($left > 0.001 ? $left : 0.001))
        or die "Could not connect to '$self->{host}:$self->{port}': $@\n";
    setsockopt($fh, Socket::IPPROTO_TCP(), Socket::TCP_NODELAY(), 1)
        or die "Could not set TCP_NODELAY on socket: $!\n";
    binmode $fh;
    $fh->blocking(0);
    my $bits = '';
    vec($bits, fileno $fh, 1) = 1;
    @$self{qw(fh bits pid)} = ($fh, $bits, $$);
}

# POST /tumbler.v1.LockService/$method with the JSON $content (bytes);
# the answer as HTTP::Tiny gives it.
sub post {
    my ($self, $method, $content, $timeout) = @_;
    my $res = eval { $self->_post($method, $content, _now() + $timeout) };
    return $res if $res;
    my $e = $@;
    $self->disconnect;   # whatever was on the wire is abandoned with the connection
    return $e if ref $e eq 'HASH' && exists $e->{status};   # _interruptible's
    $e = "$e";
    return { status => 599, reason => 'Internal Exception', content => $e,
             headers => { 'content-type' => 'text/plain', 'content-length' => length $e } };
}

sub _post {
    my ($self, $method, $content, $deadline) = @_;
    if ($self->{fh}) {
        # Reused: a connection the server closed (or that has anything to
        # read before we asked) is not used again.
        if ($self->{pid} != $$) { $self->{fh} = undef }
        else {
            my $bits = $self->{bits};
            if (select($bits, undef, undef, 0)) { $self->disconnect }
        }
    }
    $self->_connect($deadline) unless $self->{fh};
    my $fh = $self->{fh};
    my $ms = int(($deadline - _now()) * 1000);
    my $req = "POST $self->{prefix}/tumbler.v1.LockService/$method HTTP/1.1\r\n$self->{head}"
        . 'Connect-Timeout-Ms: ' . ($ms > 0 ? $ms : 1) . "\r\nContent-Length: " . length($content)
        . "\r\n\r\n" . $content;
    my ($off, $len) = (0, length $req);
    while ($off < $len) {
        my $n = $NOSIGNAL ? send($fh, substr($req, $off), $NOSIGNAL)
            : do { local $SIG{PIPE} = 'IGNORE'; syswrite($fh, $req, $len - $off, $off) };
        if (defined $n) { $off += $n; next }
        if ($!{EAGAIN} || $!{EWOULDBLOCK}) { $self->_wait($deadline, 1); next }
        next if $!{EINTR};
        die "Could not write to socket: '$!'\n";
    }
    my $buf = '';
    my ($status, $reason, %headers, $body_at, $need, $chunked);
    while (1) {
        $self->_wait($deadline);
        my $n = sysread($fh, $buf, 65536, length $buf);
        if (!defined $n) {
            next if $!{EAGAIN} || $!{EWOULDBLOCK} || $!{EINTR};
            die "Could not read from socket: '$!'\n";
        }
        my $eof = $n == 0;
        if (!defined $body_at) {
            my $end = index $buf, "\r\n\r\n";
            if ($end < 0) {
                die "Unexpected end of stream while reading response header\n" if $eof;
                next;
            }
            my @lines = split /\r\n/, substr($buf, 0, $end);
            my $line = shift @lines;
            ($status, $reason) = $line =~ m{^HTTP/1\.[01][ \t]+(\d{3})(?:[ \t]+([^\r\n]*))?$}
                or die "Malformed Status-Line: $line\n";
            %headers = ();
            for (@lines) {
                my ($k, $v) = /^([^:]+):[ \t]*(.*?)[ \t]*$/ or die "Malformed header line: $_\n";
                $k = lc $k;
                $headers{$k} = exists $headers{$k} ? "$headers{$k}, $v" : $v;
            }
            if ($status < 200) {   # 100 Continue and the like: the answer follows
                substr($buf, 0, $end + 4) = '';
                next;
            }
            $body_at = $end + 4;
            $chunked = ($headers{'transfer-encoding'} // '') =~ /chunked/i;
            $need = $chunked ? undef : $headers{'content-length'};
            die "Invalid Content-Length: $need\n" if defined $need && $need !~ /^\d+$/;
        }
        my $body;
        if (defined $need) {
            if (length($buf) - $body_at < $need) {
                die "Unexpected end of stream while reading response body\n" if $eof;
                next;
            }
            $body = substr $buf, $body_at, $need;
        } elsif ($chunked) {
            $body = _dechunk($buf, $body_at);
            if (!defined $body) {
                die "Unexpected end of stream while reading chunked response body\n" if $eof;
                next;
            }
        } else {
            next unless $eof;   # no length: the body ends with the connection
            $body = substr $buf, $body_at;
            $headers{connection} = 'close';
        }
        $self->disconnect if ($headers{connection} // '') =~ /\bclose\b/i;
        return { status => 0 + $status, reason => $reason // '', headers => \%headers, content => $body };
    }
}

# A whole chunked body from $buf at $at, or undef while some is missing.
sub _dechunk {
    my ($buf, $at) = @_;
    my $body = '';
    while (1) {
        my $eol = index $buf, "\r\n", $at;
        return undef if $eol < 0;
        my ($size) = substr($buf, $at, $eol - $at) =~ /^([0-9A-Fa-f]+)/ or die "Malformed chunk head\n";
        $size = hex $size;
        $at = $eol + 2;
        if ($size == 0) {   # trailers up to an empty line
            my $end = index $buf, "\r\n", $at;
            while ($end >= 0 && $end != $at) { $at = $end + 2; $end = index $buf, "\r\n", $at }
            return $end < 0 ? undef : $body;
        }
        return undef if length($buf) < $at + $size + 2;
        $body .= substr $buf, $at, $size;
        $at += $size + 2;
    }
}

# HTTP::Tiny with TCP_NODELAY on its connections. It writes a request's
# head and body in two writes; on a kept-alive connection Nagle's algorithm
# then holds the body until the server ACKs the head, and the server
# delays that ACK (about 40 ms on Linux), so every call after a
# connection's first would wait for it. Set once the connection (and its
# TLS handshake) is up; a kept-alive connection keeps it.
package Tumbler::Client::HTTP;
use Socket ();
our @ISA = ('HTTP::Tiny');

sub _open_handle {
    my $self = shift;
    my $handle = $self->SUPER::_open_handle(@_);
    setsockopt($handle->{fh}, Socket::IPPROTO_TCP(), Socket::TCP_NODELAY(), 1)
        or die "Could not set TCP_NODELAY on socket: $!\n";
    return $handle;
}

1;

__END__

=head1 NAME

Tumbler::Client - the tumbler lock service over the Connect protocol (JSON over HTTP)

=head1 SYNOPSIS

    use Tumbler::Client;
    my $client = Tumbler::Client->new(
        endpoint  => 'http://127.0.0.1:50051',   # the gRPC port, which speaks Connect
        token     => $ENV{TUMBLER_TOKEN},        # sent as Authorization: Bearer
        namespace => 'billing',                  # default: the server's
        timeout   => 10,                         # seconds per call, retries included
        ca_file   => '/etc/tumbler/ca.pem',      # https: the CAs to verify with (default: the system's)
    );
    {
        my $lock = $client->lock('reports', ttl_ms => 30_000, wait_ms => 5_000);
        do_work($lock->fencing_token);
    }   # released here

=head1 METHODS

C<new(%args)>: C<endpoint>, C<token>, C<namespace>, C<timeout>; for an
C<https> endpoint C<ca_file> (a PEM file of the CAs to trust; default the
system's) and C<ssl_options> (more L<IO::Socket::SSL> options, such as
C<SSL_cert_file> and C<SSL_key_file> for a client certificate). The
server's certificate is always verified; one that does not verify dies
C<Tumbler::Error::TLS> at once, before anything is sent. C<new> dies
naming L<IO::Socket::SSL> and L<Net::SSLeay> when an https endpoint needs
them and they are missing. Calls share one kept-alive connection with
TCP_NODELAY set, so no call waits for the server's delayed ACK.

Leader election: C<campaign($name, %opts)> (value, candidate, ttl_ms,
wait_ms, queue_ttl_ms, kind) returns a L<Tumbler::Leadership> or undef when
not elected within wait_ms; C<leader($name)> the current leadership hash or
undef; C<proclaim($name, candidate =E<gt> ..., term =E<gt> ..., value =E<gt>
...)> and C<resign($name, candidate =E<gt> ..., term =E<gt> ...)> act for a
candidate and term; C<observe($name, $code)> calls C<$code> with each leader
change until it returns false.

C<acquire($name, %opts)> (holder, ttl_ms, wait_ms, queue_ttl_ms, limit,
kind, metadata, priority, fair, mode, prefer_readers, permits, namespace,
timeout) returns the grant as a hash (holder, fencing_token, slot, slots,
permits, expires_at_ms, ttl_ms, kind, metadata, mode, status C<acquired> or C<already_held>) or dies
C<Tumbler::Error::NotAcquired> (kind C<busy>, or C<timeout> after
wait_ms). Without a holder the client makes one, and retries of an
unavailable server send that same holder, so a retry never takes a second
permit. C<mode =E<gt> 'read'> or C<'write'> makes it a read/write lock:
any number of readers (up to C<limit>, default the server's maximum) or
one writer, never both; the grant's C<mode> is C<read> or C<write> (undef
for a plain lock). C<prefer_readers =E<gt> 1> lets a reader pass writers
that wait. An upgrade (a reader asking C<write>) and a plain acquire of a
held read/write lock die C<Tumbler::Error::FailedPrecondition> (a
C<Tumbler::Error::InvalidArgument>, code C<failed_precondition>). C<permits =E<gt> $k> takes k of the C<limit> at
once (golang's C<semaphore.Weighted>); the grant's C<permits> is how many
it holds (1 unless asked more) and C<slots> its slots, one per permit
(an array). More than the limit, or with a C<mode>, dies
C<Tumbler::Error::InvalidArgument> with the server's message
(C<permits: ...>).

Multi-locks: C<acquire_all(\@names, %opts)> (holder, ttl_ms, wait_ms,
queue_ttl_ms, limit, kind, metadata) takes 2 to 16 locks together, all or
none, and returns the set as a hash (holder, names, status, grants: one
grant hash per name in the order asked, each with its C<name> and own
C<fencing_token>); it dies as C<acquire> does, and
C<Tumbler::Error::InvalidArgument> naming C<names> for a name twice.
C<extend_all(\@names, holder =E<gt> ..., ttl_ms =E<gt> ...)> and
C<release_all(\@names, holder =E<gt> ...)> act on the set, each lock
pinned to its token with C<fencing_tokens =E<gt> $set-E<gt>{fencing_tokens}>
(one per name, in the order of the names);
C<lock_all(\@names, %opts)> returns a L<Tumbler::LockSet> guard, whose
release and extend are always pinned to the tokens it was granted. A wait
that would close a wait-for cycle dies C<Tumbler::Error::Deadlock>.

C<release($name, holder =E<gt> ..., fencing_token =E<gt> ...)> returns true
if released, false if not held. C<extend($name, holder =E<gt> ..., ttl_ms
=E<gt> ..., fencing_token =E<gt> ...)> returns the renewed grant or dies
C<Tumbler::Error::NotHeld>. C<inspect($name)>, C<queue($name)>,
C<list(%opts)>, C<reap(%opts)>, C<clear(%opts)> and C<metrics(%opts)> return
the answer as a hash with snake_case keys. C<lock($name, %opts)> returns a
L<Tumbler::Lock> guard.

Each method is one C<POST /tumbler.v1.LockService/E<lt>MethodE<gt>>. A call
that finds no server (connection refused or broken) or gets C<503
unavailable> is retried with jittered back-off until its deadline
(C<timeout>, plus wait_ms for a waiting acquire), then dies
C<Tumbler::Error::Unavailable>. Errors: L<Tumbler::Error>.

A C<die> from a signal handler (a code ref in C<%SIG> for ALRM, INT, TERM,
HUP, QUIT, USR1 or USR2) while a call is on the wire stops the call: the
exception leaves it as it was thrown (it is not taken for an unavailable
server and retried), and the connection is closed, so the server drops a
waiting acquire from its queue. C<alarm> is the way to cancel a wait.

=cut
