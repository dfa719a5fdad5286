// Package tumbler is a thin helper over the generated gRPC stubs of the
// tumbler lock service (package tumbler/tumblerv1, generated from
// proto/ by generate.sh). Client.Stub is the full API; this package adds
// acquire with a wait and a deadline, WithLock (release by defer), Extend,
// and the grant's fencing token and slot.
package tumbler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pb "tumbler/tumblerv1"
)

// DeadlineSlack is added to WaitMs for the RPC deadline when ctx has none,
// so the server's own TIMEOUT reply wins over DEADLINE_EXCEEDED.
const DeadlineSlack = 5 * time.Second

// ErrLockLost: Extend answered NOT_HELD; stop working on what the lock protected.
var ErrLockLost = errors.New("tumbler: lock lost")

// Client wraps a connection and the generated stub.
type Client struct {
	Stub      pb.LockServiceClient
	Namespace string
	Conn      *grpc.ClientConn
}

// Dial connects without TLS unless opts say otherwise.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithInsecure()}
	}
	conn, err := grpc.Dial(target, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{Stub: pb.NewLockServiceClient(conn), Conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }

// AcquireOptions: zero values mean the server's defaults (limit 1, default
// lease, try once, fair).
type AcquireOptions struct {
	Holder     string
	WaitMs     uint64 // wait in the server this long; 0 tries once
	Limit      uint32
	TTLMs      uint64
	Kind       string
	Metadata   map[string]string
	Priority   int32
	QueueTTLMs uint64
	Barging    bool
}

// NotAcquiredError: the lock was busy (tried once) or the wait timed out.
type NotAcquiredError struct {
	Name     string
	Response *pb.AcquireResponse
}

func (e *NotAcquiredError) Error() string {
	return fmt.Sprintf("%s: not acquired (%s, %d holder(s))", e.Name, e.Response.Reason, e.Response.Holders)
}

// Busy tells a try-once refusal; Timeout a wait that ended without a grant.
func (e *NotAcquiredError) Busy() bool    { return e.Response.Reason == pb.NotAcquiredReason_NOT_ACQUIRED_REASON_BUSY }
func (e *NotAcquiredError) Timeout() bool { return e.Response.Reason == pb.NotAcquiredReason_NOT_ACQUIRED_REASON_TIMEOUT }

// Lock is one grant.
type Lock struct {
	Name  string
	Grant *pb.Grant
	c     *Client
}

func (l *Lock) Holder() string       { return l.Grant.Holder }
func (l *Lock) FencingToken() uint64 { return l.Grant.FencingToken }
func (l *Lock) Slot() uint32         { return l.Grant.Slot }

// Acquire takes a permit; the error is a *NotAcquiredError when not granted.
func (c *Client) Acquire(ctx context.Context, name string, o AcquireOptions) (*Lock, error) {
	req := &pb.AcquireRequest{Namespace: c.Namespace, Name: name, Holder: o.Holder, Kind: o.Kind,
		Metadata: o.Metadata, WaitMs: o.WaitMs, Priority: o.Priority}
	if o.Limit != 0 {
		req.Limit = proto.Uint32(o.Limit)
	}
	if o.TTLMs != 0 {
		req.TtlMs = proto.Uint64(o.TTLMs)
	}
	if o.QueueTTLMs != 0 {
		req.QueueTtlMs = proto.Uint64(o.QueueTTLMs)
	}
	if o.Barging {
		req.Fair = proto.Bool(false)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(o.WaitMs)*time.Millisecond+DeadlineSlack)
		defer cancel()
	}
	resp, err := c.Stub.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	if resp.Status == pb.AcquireStatus_ACQUIRE_STATUS_NOT_ACQUIRED {
		return nil, &NotAcquiredError{Name: name, Response: resp}
	}
	return &Lock{Name: name, Grant: resp.Grant, c: c}, nil
}

// WithLock runs fn while holding the lock and releases it however fn ends.
func (c *Client) WithLock(ctx context.Context, name string, o AcquireOptions, fn func(*Lock) error) error {
	l, err := c.Acquire(ctx, name, o)
	if err != nil {
		return err
	}
	defer l.Release(context.Background())
	return fn(l)
}

// Extend resets the lease to ttlMs from now (0: the grant's own ttl).
func (l *Lock) Extend(ctx context.Context, ttlMs uint64) error {
	req := &pb.ExtendRequest{Namespace: l.c.Namespace, Name: l.Name, Holder: l.Holder(),
		FencingToken: proto.Uint64(l.FencingToken())}
	if ttlMs != 0 {
		req.TtlMs = proto.Uint64(ttlMs)
	}
	resp, err := l.c.Stub.Extend(ctx, req)
	if err != nil {
		return err
	}
	if resp.Status != pb.ExtendStatus_EXTEND_STATUS_EXTENDED {
		return ErrLockLost
	}
	l.Grant = resp.Grant
	return nil
}

// Release gives the permit back; false when it was no longer held.
func (l *Lock) Release(ctx context.Context) (bool, error) {
	resp, err := l.c.Stub.Release(ctx, &pb.ReleaseRequest{Namespace: l.c.Namespace, Name: l.Name,
		Holder: l.Holder(), FencingToken: proto.Uint64(l.FencingToken())})
	if err != nil {
		return false, err
	}
	return resp.Status == pb.ReleaseStatus_RELEASE_STATUS_RELEASED, nil
}
