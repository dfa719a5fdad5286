package tumbler

// Multi-locks (decision 0076): several locks of the namespace taken
// together, all or none, by one Acquire naming the set. A LockSet is a
// Lock whose Extend and Release name the set, so it shares the lock's
// watchdog, Lost() and Err(). Its Extend and Release carry each lock's
// fencing token (decision 0079), so a late release of a set never touches
// a newer set of the same holder.

import (
	"context"
	"strings"
	"time"

	pb "tumbler/client/tumblerv1"
)

// LockSet is a multi-lock's grants, one per name, held and given back as one.
type LockSet struct {
	lock   *Lock
	names  []string
	grants []*pb.Grant
}

// AcquireAll takes every lock of names (2 to 16 distinct names) or none,
// for one holder with one lease, waiting up to o.WaitMs in the server.
// While it waits it holds nothing: the server tries the whole set again
// whenever a lock of it frees. Each lock grants one permit under o.Limit
// (default 1); Mode and Permits > 1 are refused. Retries, deadline and
// cancellation as Acquire. Errors: *NotAcquiredError (ErrBusy /
// ErrTimeout; Name is the names joined by commas), ErrInvalidArgument
// (fewer than 2 or more than 16 names, a name twice: the message starts
// with "names"), ErrDeadlock, *Error, ctx.Err().
func (c *Client) AcquireAll(ctx context.Context, names []string, o AcquireOptions) (*LockSet, error) {
	names = append(make([]string, 0, len(names)), names...) // never nil: a set
	resp, sent, err := c.acquire(ctx, "", names, &o)
	if err != nil {
		return nil, err
	}
	// The set's lease is as long as its shortest.
	first := resp.Grant
	for _, g := range resp.Grants {
		if first == nil || g.ExpiresAtMs < first.ExpiresAtMs {
			first = g
		}
	}
	if first == nil {
		first = &pb.Grant{Holder: o.Holder}
	}
	l := newLock(c, strings.Join(names, ","), first, sent)
	s := &LockSet{lock: l, names: names, grants: resp.Grants}
	l.names, l.limit, l.tokens = names, o.Limit, s.FencingTokens()
	return s, nil
}

// WithLocks runs fn while holding every lock of names, as WithLock does
// for one: a watchdog extends the set every TTLMs/3 (default lease
// DefaultHelperTTL); if any lock of the set is lost, fn's ctx is cancelled
// and WithLocks returns a *LockLostError. Otherwise the set is released
// however fn ends.
func (c *Client) WithLocks(ctx context.Context, names []string, o AcquireOptions, fn func(ctx context.Context, s *LockSet) error) error {
	if o.TTLMs == 0 {
		o.TTLMs = uint64(DefaultHelperTTL / time.Millisecond)
	}
	s, err := c.AcquireAll(ctx, names, o)
	if err != nil {
		return err
	}
	return hold(ctx, s.lock, func(ctx context.Context) error { return fn(ctx, s) })
}

// ReleaseAll releases the set names held by holder without a LockSet (a
// crashed process's set, by its holder id); false when any lock of it was
// not held (the holder's others are released all the same). With tokens
// (one per name, in the order of names: a LockSet's FencingTokens), each
// lock is released only where the holder's grant carries its token; a
// lock taken again since is left alone and makes the answer false.
func (c *Client) ReleaseAll(ctx context.Context, names []string, holder string, tokens ...uint64) (bool, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	req := &pb.ReleaseRequest{Namespace: c.Namespace, Names: names, Holder: holder, FencingTokens: tokens}
	var resp *pb.ReleaseResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.Stub.Release(ctx, req)
		return err
	})
	if err != nil {
		return false, fromRPC(err)
	}
	return resp.Status == pb.ReleaseStatus_RELEASE_STATUS_RELEASED, nil
}

// Names are the set's names, in the order asked.
func (s *LockSet) Names() []string { return append([]string(nil), s.names...) }

// Holder is the holder id of every grant of the set.
func (s *LockSet) Holder() string { return s.lock.Holder() }

// Grants are the grants as acquired, one per name in the order asked, each
// with its Name and own fencing token.
func (s *LockSet) Grants() []*pb.Grant { return s.grants }

// FencingToken is the fencing token of the lock name of the set; false
// when name is not in the set.
func (s *LockSet) FencingToken(name string) (uint64, bool) {
	for _, g := range s.grants {
		if g.Name == name {
			return g.FencingToken, true
		}
	}
	return 0, false
}

// FencingTokens are the set's fencing tokens, one per name in the order
// of Names (0 where no grant names it); its Extend and Release carry them.
func (s *LockSet) FencingTokens() []uint64 {
	tokens := make([]uint64, len(s.names))
	for i, name := range s.names {
		tokens[i], _ = s.FencingToken(name)
	}
	return tokens
}

// Extend resets every lease of the set to ttlMs from now (0: the grants'
// own ttl); a *LockLostError (ErrLockLost) when any lock of the set was
// gone (the server then releases the rest).
func (s *LockSet) Extend(ctx context.Context, ttlMs uint64) error { return s.lock.Extend(ctx, ttlMs) }

// ExpiresAtMs is when the set's first lease ends, as last extended.
func (s *LockSet) ExpiresAtMs() int64 { return s.lock.Grant().ExpiresAtMs }

// Release stops the watchdog and gives the set back: false when any lock
// was no longer held (the others are released all the same).
func (s *LockSet) Release(ctx context.Context) (bool, error) { return s.lock.Release(ctx) }

// KeepAlive starts the watchdog (once): one Extend naming the set every
// third of the lease; StopKeepAlive or Release ends it.
func (s *LockSet) KeepAlive() { s.lock.KeepAlive() }

// StopKeepAlive ends the watchdog and waits for it.
func (s *LockSet) StopKeepAlive() { s.lock.StopKeepAlive() }

// Lost is closed the moment any lock of the set is known to be gone.
func (s *LockSet) Lost() <-chan struct{} { return s.lock.Lost() }

// Err is nil while the set is believed held, a *LockLostError after.
func (s *LockSet) Err() error { return s.lock.Err() }
