use strict;
use warnings;
use Test::More;
use JSON::PP ();
use Tumbler::Client;

# The client encodes with Cpanel::JSON::XS or JSON::XS when one is
# installed, else with JSON::PP. Whichever it took, what it sends and what
# it reads back are JSON::PP's: the bodies the client builds (64-bit
# integers as strings, 32-bit ones as numbers, booleans, metadata, UTF-8
# names) give the same bytes, and answers the same data.
diag("JSON by $Tumbler::Client::JSON_CLASS");
my $pp = JSON::PP->new->utf8->canonical;
my $xs = $Tumbler::Client::JSON_CLASS->new->utf8->canonical;
my $client = Tumbler::Client->new(endpoint => 'http://127.0.0.1:1');

my @bodies = (
    $client->_body(Acquire => { name => "caf\x{e9}-\x{263a}" }, {
        holder => 'h-1', ttl_ms => 10_000, wait_ms => '18446744073709551615', limit => 4, priority => -2,
        fair => 0, prefer_readers => 1, mode => 'read', permits => 2,
        metadata => { pid => 42, who => "\x{fc}ber", n => 1.5 }, namespace => 'billing' }),
    $client->_body(Release => { names => [ 'a', 'b' ] }, { holder => 'h', fencing_tokens => [ 1795954598327812, '7' ] }),
    $client->_body(Extend => { name => 'x' }, { holder => 'h', ttl_ms => 0, fencing_token => '1795954598327812' }),
    {},
);
for my $b (@bodies) {
    is $xs->encode($b), $pp->encode($b), 'the same bytes: ' . $pp->encode($b);
}
for my $answer (
    '{"status":"ACQUIRE_STATUS_ACQUIRED","grant":{"holder":"h","fencingToken":"1795954598327812","slot":1,'
      . '"acquiredAtMs":"1795954598327","ttlMs":"1000","metadata":{"w\u00fcr":"\u263a"},"slots":[1,2]},"holders":1}',
    '{"elected":true,"leader":{"term":"12","value":"caf\u00e9"},"secret":"s"}',
    '{"elected":false}',
) {
    my ($a, $b) = ($xs->decode($answer), $pp->decode($answer));
    is_deeply Tumbler::Client::_snake($a), Tumbler::Client::_snake($b), "the same data: $answer";
}
my $t = $xs->decode('{"a":true,"b":false}');
ok $t->{a} && !$t->{b}, 'booleans are true and false';
isa_ok $t->{a}, 'JSON::PP::Boolean';
ok !eval { $xs->decode('not json'); 1 }, 'what is not JSON dies';

done_testing;
