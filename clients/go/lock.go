package tumbler

// A grant (Lock), its watchdog, and WithLock. The watchdog extends the
// lease every third of it, pinned to the fencing token; NOT_HELD, or
// renewals that fail until the lease has run out, mark the lock lost at
// once: Lost() closes and the context WithLock gave the body is cancelled.

import (
	"context"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "tumbler/client/tumblerv1"
)

// Lock is one grant.
type Lock struct {
	Name  string
	c     *Client
	limit uint32   // the limit asked: a downgrade asks the same
	names []string // a multi-lock's names: Extend and Release name the set
	// A multi-lock's fencing tokens, in the order of names: its Extend and
	// Release are pinned to them, lock by lock.
	tokens []uint64

	mu       sync.Mutex
	grant    *pb.Grant
	leaseEnd time.Time // local estimate of when the lease runs out
	lostErr  error
	lost     chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

func newLock(c *Client, name string, g *pb.Grant, sent time.Time) *Lock {
	return &Lock{Name: name, c: c, grant: g, leaseEnd: sent.Add(time.Duration(g.TtlMs) * time.Millisecond),
		lost: make(chan struct{})}
}

// Grant is the grant as last renewed.
func (l *Lock) Grant() *pb.Grant {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.grant
}

func (l *Lock) Holder() string       { return l.Grant().Holder }
func (l *Lock) FencingToken() uint64 { return l.Grant().FencingToken }
func (l *Lock) Slot() uint32         { return l.Grant().Slot }

// Permits is how many permits the grant holds (1 unless acquired with
// AcquireOptions.Permits).
func (l *Lock) Permits() uint32 {
	if p := l.Grant().Permits; p > 1 {
		return p
	}
	return 1
}

// Slots are the grant's slots, one per permit, ascending; the first is Slot.
func (l *Lock) Slots() []uint32 {
	g := l.Grant()
	if len(g.Slots) == 0 {
		return []uint32{g.Slot}
	}
	return append([]uint32(nil), g.Slots...)
}

// Mode is ModeRead or ModeWrite for a grant of a read/write lock,
// LOCK_MODE_UNSPECIFIED for a plain lock's.
func (l *Lock) Mode() pb.LockMode { return l.Grant().Mode }

// Downgrade turns a write grant into a read grant at once: the same fencing
// token, slot and lease; readers may then join. A plain lock is an *Error
// (FAILED_PRECONDITION); a grant that is gone is a *LockLostError.
func (l *Lock) Downgrade(ctx context.Context) error {
	ctx, cancel := l.c.bounded(ctx)
	defer cancel()
	g := l.Grant()
	req := &pb.AcquireRequest{Namespace: l.c.Namespace, Name: l.Name, Holder: g.Holder, Kind: g.Kind,
		TtlMs: proto.Uint64(g.TtlMs), Mode: ModeRead}
	if l.limit != 0 {
		req.Limit = proto.Uint32(l.limit)
	}
	sent := time.Now()
	var resp *pb.AcquireResponse
	err := l.c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = l.c.Stub.Acquire(ctx, req)
		return err
	})
	if err != nil {
		return fromRPC(err)
	}
	if resp.Status == pb.AcquireStatus_ACQUIRE_STATUS_NOT_ACQUIRED || resp.Grant.GetFencingToken() != g.FencingToken {
		if resp.Status != pb.AcquireStatus_ACQUIRE_STATUS_NOT_ACQUIRED { // a new grant, not ours: give it back
			_, _ = l.c.Stub.Release(ctx, &pb.ReleaseRequest{Namespace: l.c.Namespace, Name: l.Name,
				Holder: g.Holder, FencingToken: proto.Uint64(resp.Grant.GetFencingToken())})
		}
		l.markLost("not held")
		return l.Err()
	}
	l.renewed(resp.Grant, sent)
	return nil
}

// Lost is closed the moment the grant is known to be gone; Err then says why.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is nil while the grant is believed held, a *LockLostError after.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

func (l *Lock) markLost(reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostErr != nil {
		return
	}
	l.lostErr = &LockLostError{Name: l.Name, Holder: l.grant.Holder, FencingToken: l.grant.FencingToken, Reason: reason}
	close(l.lost)
}

func (l *Lock) renewed(g *pb.Grant, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.grant = g
	l.leaseEnd = sent.Add(time.Duration(g.TtlMs) * time.Millisecond)
}

func (l *Lock) extendRequest(ttlMs uint64) *pb.ExtendRequest {
	g := l.Grant()
	req := &pb.ExtendRequest{Namespace: l.c.Namespace, Name: l.Name, Holder: g.Holder,
		FencingToken: proto.Uint64(g.FencingToken)}
	if l.names != nil { // the set: each lock has its own token
		req.Name, req.Names, req.FencingToken, req.FencingTokens = "", l.names, nil, l.tokens
	}
	if ttlMs != 0 {
		req.TtlMs = proto.Uint64(ttlMs)
	}
	return req
}

// Extend resets the lease to ttlMs from now (0: the grant's own ttl);
// a *LockLostError (ErrLockLost) when the grant is gone.
func (l *Lock) Extend(ctx context.Context, ttlMs uint64) error {
	ctx, cancel := l.c.bounded(ctx)
	defer cancel()
	sent := time.Now()
	var resp *pb.ExtendResponse
	err := l.c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = l.c.Stub.Extend(ctx, l.extendRequest(ttlMs))
		return err
	})
	if err != nil {
		return fromRPC(err)
	}
	if resp.Status != pb.ExtendStatus_EXTEND_STATUS_EXTENDED {
		l.markLost("not held")
		return l.Err()
	}
	l.renewed(resp.Grant, sent)
	return nil
}

// Release gives the permit back (pinned to the fencing token) and stops
// the watchdog; false when it was no longer held.
func (l *Lock) Release(ctx context.Context) (bool, error) {
	l.StopKeepAlive()
	ctx, cancel := l.c.bounded(ctx)
	defer cancel()
	g := l.Grant()
	req := &pb.ReleaseRequest{Namespace: l.c.Namespace, Name: l.Name, Holder: g.Holder,
		FencingToken: proto.Uint64(g.FencingToken)}
	if l.names != nil {
		req.Name, req.Names, req.FencingToken, req.FencingTokens = "", l.names, nil, l.tokens
	}
	var resp *pb.ReleaseResponse
	err := l.c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = l.c.Stub.Release(ctx, req)
		return err
	})
	if err != nil {
		return false, fromRPC(err)
	}
	return resp.Status == pb.ReleaseStatus_RELEASE_STATUS_RELEASED, nil
}

// KeepAlive starts the watchdog (once); StopKeepAlive or Release ends it.
func (l *Lock) KeepAlive() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stop != nil {
		return
	}
	l.stop, l.done = make(chan struct{}), make(chan struct{})
	go l.watch(l.stop, l.done)
}

// StopKeepAlive ends the watchdog and waits for it.
func (l *Lock) StopKeepAlive() {
	l.mu.Lock()
	stop, done := l.stop, l.done
	l.stop = nil
	l.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

func (l *Lock) watch(stop, done chan struct{}) {
	defer close(done)
	ttl := time.Duration(l.Grant().TtlMs) * time.Millisecond
	interval := ttl / 3
	next, attempt := time.Now().Add(interval), 0
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Until(next)):
		}
		if !l.renewOnce(stop, &next, &attempt, interval) {
			return
		}
	}
}

// renewOnce sends one Extend; false once the lock is lost or stopped.
func (l *Lock) renewOnce(stop chan struct{}, next *time.Time, attempt *int, interval time.Duration) bool {
	l.mu.Lock()
	leaseEnd := l.leaseEnd
	l.mu.Unlock()
	sent := time.Now()
	timeout := interval
	if left := time.Until(leaseEnd); left < timeout {
		timeout = left
	}
	if timeout < 50*time.Millisecond {
		timeout = 50 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(l.c.outgoing(context.Background()), timeout)
	resp, err := l.c.Stub.Extend(ctx, l.extendRequest(uint64(l.Grant().TtlMs)))
	cancel()
	select {
	case <-stop:
		return false
	default:
	}
	if err != nil {
		if retryable(err) {
			l.c.reconnectSoon()
		}
		if !time.Now().Before(leaseEnd) {
			l.markLost("renewals failed until the lease ran out (" + fromRPC(err).Error() + ")")
			return false
		}
		*next = time.Now().Add(l.c.Retry.delay(*attempt))
		if next.After(leaseEnd) {
			*next = leaseEnd
		}
		*attempt++
		return true
	}
	if resp.Status != pb.ExtendStatus_EXTEND_STATUS_EXTENDED {
		l.markLost("not held")
		return false
	}
	l.renewed(resp.Grant, sent)
	*next, *attempt = sent.Add(interval), 0
	return true
}

// WithLock runs fn while holding the lock. A watchdog extends the lease
// every TTLMs/3 (default lease DefaultHelperTTL); if the grant is lost,
// the ctx given to fn is cancelled at once and WithLock returns a
// *LockLostError (errors.Is(err, ErrLockLost)). Otherwise the grant is
// released however fn ends. Cancelling ctx while waiting cancels the wait.
func (c *Client) WithLock(ctx context.Context, name string, o AcquireOptions, fn func(ctx context.Context, l *Lock) error) error {
	if o.TTLMs == 0 {
		o.TTLMs = uint64(DefaultHelperTTL / time.Millisecond)
	}
	l, err := c.Acquire(ctx, name, o)
	if err != nil {
		return err
	}
	return hold(ctx, l, func(ctx context.Context) error { return fn(ctx, l) })
}

// hold runs fn with the watchdog on: fn's ctx is cancelled when l is lost
// (then a *LockLostError is returned); otherwise l is released after fn.
func hold(ctx context.Context, l *Lock, fn func(ctx context.Context) error) error {
	l.KeepAlive()
	body, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.Lost():
			cancel()
		case <-body.Done():
		}
	}()
	ferr := fn(body)
	l.StopKeepAlive()
	if lost := l.Err(); lost != nil {
		return lost
	}
	if _, err := l.Release(context.Background()); err != nil && ferr == nil {
		return err
	}
	return ferr
}
