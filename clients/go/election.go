package tumbler

// Leader election: Campaign returns a Leadership kept by the same watchdog
// as a Lock (its holder is the candidate, its fencing token the term, so
// Extend is pinned to the term); Lost() closes when the term ends under it.
// Proclaim and Resign act only with this term. Leader reads the current
// leader; Observe streams the election's leader changes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "tumbler/client/tumblerv1"
)

// LeaderChange is one change Observe tells.
type LeaderChange = pb.LeaderChange

// ErrNotLeader: the leadership's term is over (Proclaim answered NOT_LEADER,
// or the watchdog's Extend NOT_HELD). errors.Is(err, ErrLockLost) holds too.
var ErrNotLeader = errors.New("tumbler: not the leader")

// NotLeaderError: Candidate no longer leads election Name with Term.
type NotLeaderError struct {
	Name      string
	Candidate string
	Term      uint64
	Reason    string
}

func (e *NotLeaderError) Error() string {
	return fmt.Sprintf("tumbler: %s: %s no longer leads (term %d): %s", e.Name, e.Candidate, e.Term, e.Reason)
}

func (e *NotLeaderError) Is(target error) bool {
	return target == ErrNotLeader || target == ErrLockLost
}

// CampaignOptions: zero values mean the defaults (lease DefaultHelperTTL,
// try once). Candidate defaults to an id made by the client before the
// first try, so a retried Campaign is the same candidacy.
type CampaignOptions struct {
	Candidate  string
	Value      string // what others see (Leader, Observe) while this candidate leads
	WaitMs     uint64 // wait in the election's queue this long; 0 tries once
	TTLMs      uint64
	QueueTTLMs uint64
	Kind       string
}

// Leadership is one term of this process as the leader.
type Leadership struct {
	Name string
	lock *Lock

	// secret is told only to the winning Campaign: Proclaim and Resign
	// send it (the candidate and term are anyone's to read).
	secret string

	mu       sync.Mutex
	leader   *pb.Leadership
	resigned bool
}

// Leader is the leadership as last told by the server (candidate, term, value, times).
func (l *Leadership) Leader() *pb.Leadership {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leader
}

func (l *Leadership) Candidate() string { return l.Leader().Candidate }

// Term is the leader's fencing token: hand it to what the leader writes to.
func (l *Leadership) Term() uint64  { return l.Leader().Term }
func (l *Leadership) Value() string { return l.Leader().Value }

// Lost is closed the moment the term is known to be over (the lease could
// not be kept, Extend answered NOT_HELD, or Proclaim NOT_LEADER); Err says why.
func (l *Leadership) Lost() <-chan struct{} { return l.lock.Lost() }

// Err is nil while this candidate is believed to lead, a *NotLeaderError after.
func (l *Leadership) Err() error {
	lost := l.lock.Err()
	if lost == nil {
		return nil
	}
	var ll *LockLostError
	reason := lost.Error()
	if errors.As(lost, &ll) {
		reason = ll.Reason
	}
	return &NotLeaderError{Name: l.Name, Candidate: l.Candidate(), Term: l.Term(), Reason: reason}
}

// Proclaim replaces the value others see; a *NotLeaderError (and Lost
// closes) when the term is over.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	ctx, cancel := l.lock.c.bounded(ctx)
	defer cancel()
	c := l.lock.c
	var resp *pb.ProclaimResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.Stub.Proclaim(ctx, &pb.ProclaimRequest{Namespace: c.Namespace, Name: l.Name,
			Candidate: l.Candidate(), Term: l.Term(), Value: value, Secret: l.secret})
		return err
	})
	if err != nil {
		return fromRPC(err)
	}
	if resp.Status != pb.ProclaimStatus_PROCLAIM_STATUS_PROCLAIMED {
		l.lock.markLost("not the leader")
		return l.Err()
	}
	l.mu.Lock()
	l.leader = resp.Leader
	l.mu.Unlock()
	return nil
}

// Resign steps down at once (the next candidate is elected) and stops the
// watchdog: true when this call ended the term, false when it was over
// already. Safe to call more than once.
func (l *Leadership) Resign(ctx context.Context) (bool, error) {
	l.lock.StopKeepAlive()
	l.mu.Lock()
	done := l.resigned
	l.mu.Unlock()
	if done {
		return false, nil
	}
	ctx, cancel := l.lock.c.bounded(ctx)
	defer cancel()
	c := l.lock.c
	var resp *pb.ResignResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.Stub.Resign(ctx, &pb.ResignRequest{Namespace: c.Namespace, Name: l.Name,
			Candidate: l.Candidate(), Term: l.Term(), Secret: l.secret})
		return err
	})
	if err != nil {
		return false, fromRPC(err)
	}
	l.mu.Lock()
	l.resigned = true
	l.mu.Unlock()
	return resp.Status == pb.ResignStatus_RESIGN_STATUS_RESIGNED, nil
}

// Campaign waits up to o.WaitMs in the election's queue. Elected: a
// Leadership whose watchdog extends the lease every TTLMs/3 (default lease
// DefaultHelperTTL) until Resign. Not elected within the wait: nil, nil.
// Cancelling ctx cancels the wait. Errors: *Error, ctx.Err().
func (c *Client) Campaign(ctx context.Context, name string, o CampaignOptions) (*Leadership, error) {
	if o.Candidate == "" {
		o.Candidate = newHolder()
	}
	if o.TTLMs == 0 {
		o.TTLMs = uint64(DefaultHelperTTL / time.Millisecond)
	}
	started := time.Now()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(o.WaitMs)*time.Millisecond+DeadlineSlack)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	var resp *pb.CampaignResponse
	sent := started
	err := c.retry(ctx, func(ctx context.Context) error {
		sent = time.Now()
		wait := time.Duration(o.WaitMs)*time.Millisecond - time.Since(started)
		if left := time.Until(deadline) - 50*time.Millisecond; left < wait {
			wait = left
		}
		if wait < 0 {
			wait = 0
		}
		req := &pb.CampaignRequest{Namespace: c.Namespace, Name: name, Candidate: o.Candidate, Value: o.Value,
			TtlMs: proto.Uint64(o.TTLMs), WaitMs: proto.Uint64(uint64(wait / time.Millisecond)), Kind: o.Kind}
		if o.QueueTTLMs != 0 {
			req.QueueTtlMs = proto.Uint64(o.QueueTTLMs)
		}
		var err error
		resp, err = c.Stub.Campaign(ctx, req)
		return err
	})
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return nil, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fromRPC(err)
	}
	if !resp.Elected {
		return nil, nil
	}
	if since := time.Now().Add(-50 * time.Millisecond); since.After(sent) {
		sent = since
	}
	g := &pb.Grant{Holder: resp.Leader.Candidate, FencingToken: resp.Leader.Term, Slot: 1,
		AcquiredAtMs: resp.Leader.ElectedAtMs, ExpiresAtMs: resp.Leader.ExpiresAtMs, TtlMs: resp.Leader.TtlMs}
	l := &Leadership{Name: name, lock: newLock(c, name, g, sent), leader: resp.Leader, secret: resp.Secret}
	l.lock.KeepAlive()
	return l, nil
}

// Leader returns the election's current leadership, or nil when nobody leads.
func (c *Client) Leader(ctx context.Context, name string) (*pb.Leadership, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var resp *pb.LeaderResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.Stub.Leader(ctx, &pb.LeaderRequest{Namespace: c.Namespace, Name: name})
		return err
	})
	if err != nil {
		return nil, fromRPC(err)
	}
	return resp.Leader, nil
}

// Observe calls fn with each leader change of the election: the first is
// the current leader (Event "current"), then "elected", "proclaimed",
// "resigned", "expired", "removed". It returns when ctx is cancelled (nil),
// when fn returns false (nil), or with the stream's error.
func (c *Client) Observe(ctx context.Context, name string, fn func(*LeaderChange) bool) error {
	ctx, cancel := context.WithCancel(c.outgoing(ctx))
	defer cancel()
	stream, err := c.Stub.Observe(ctx, &pb.LeaderRequest{Namespace: c.Namespace, Name: name})
	if err != nil {
		return fromRPC(err)
	}
	for {
		change, err := stream.Recv()
		if err != nil {
			if ctx.Err() != nil || status.Code(err) == codes.Canceled {
				return nil
			}
			if err == io.EOF {
				return nil
			}
			return fromRPC(err)
		}
		if !fn(change) {
			return nil
		}
	}
}
