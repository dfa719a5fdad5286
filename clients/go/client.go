// Package tumbler is the Go client of the tumbler lock service. The gRPC
// stubs (package tumbler/client/tumblerv1) are generated from
// proto/tumbler/v1/lock.proto by `go generate`; Client.Stub is the full
// API. This package adds Acquire with retries and context cancellation,
// WithLock whose grant a watchdog keeps alive (its ctx is cancelled the
// moment the grant is lost), Extend/Release pinned to the fencing token,
// and typed errors.
//
// Every call is retried on UNAVAILABLE with jittered back-off until its
// deadline, with the same holder id: a retried Acquire is the same request
// to the server (ALREADY_HELD, same grant) and never takes a second permit.
package tumbler

//go:generate ./generate.sh

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	mrand "math/rand"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pb "tumbler/client/tumblerv1"
)

// DeadlineSlack is added to WaitMs for the call's deadline when ctx has
// none, so the server's own TIMEOUT reply wins over DEADLINE_EXCEEDED.
const DeadlineSlack = 5 * time.Second

// DefaultHelperTTL is the lease WithLock asks for when the options name
// none. The watchdog renews it every third, so it only bounds how long a
// crashed holder keeps the lock.
const DefaultHelperTTL = 15 * time.Second

// Backoff is the retry schedule for UNAVAILABLE: full jitter, Initial
// doubling up to Max, until the call's deadline.
type Backoff struct{ Initial, Max time.Duration }

func (b Backoff) delay(attempt int) time.Duration {
	ceil := math.Min(float64(b.Max), float64(b.Initial)*math.Pow(2, float64(attempt)))
	return time.Duration(mrand.Int63n(int64(ceil) + 1))
}

// Client wraps a connection and the generated stub.
type Client struct {
	Stub      pb.LockServiceClient
	Conn      *grpc.ClientConn
	Namespace string
	Token     string        // sent as "authorization: Bearer <token>"
	Timeout   time.Duration // deadline of calls that do not wait, when ctx has none
	Retry     Backoff
}

// Dial connects in plaintext unless opts carry grpc.WithTransportCredentials
// (TLS). grpc-go 1.33 has no grpc.NewClient; grpc.Dial does not block.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	// Reconnect soon after a server restart: grpc-go's default backoff
	// (1 s growing to 120 s) could outlast a lease.
	reconnect := grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 5 * time.Second,
	})
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(Insecure()), reconnect}, opts...)
	conn, err := grpc.Dial(target, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{Stub: pb.NewLockServiceClient(conn), Conn: conn, Timeout: 10 * time.Second,
		Retry: Backoff{Initial: 50 * time.Millisecond, Max: time.Second}}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }

func (c *Client) outgoing(ctx context.Context) context.Context {
	if c.Token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.Token)
}

// retry runs one RPC until it succeeds, fails with something other than
// UNAVAILABLE, or ctx ends (cancelled or past its deadline).
func (c *Client) retry(ctx context.Context, rpc func(context.Context) error) error {
	ctx = c.outgoing(ctx)
	for attempt := 0; ; attempt++ {
		err := rpc(ctx)
		if err == nil || !retryable(err) {
			return err
		}
		c.reconnectSoon()
		select {
		case <-time.After(c.Retry.delay(attempt)):
		case <-ctx.Done():
			return err
		}
	}
}

// reconnectSoon makes the connection try its server again now rather than
// after its reconnect backoff (a restarted server is back on its address).
func (c *Client) reconnectSoon() {
	if c.Conn != nil {
		c.Conn.ResetConnectBackoff()
	}
}

func (c *Client) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.Timeout)
}

// AcquireOptions: zero values mean the server's defaults (limit 1, default
// lease, try once, fair). Holder defaults to an id made by the client.
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
	// Mode makes it a read/write lock: ModeRead shares with other readers
	// (up to Limit; 0: the server's maximum), ModeWrite is alone. Zero: a
	// plain lock.
	Mode pb.LockMode
	// PreferReaders (with ModeRead): take a free read permit even when
	// writers wait.
	PreferReaders bool
	// Permits takes this many of Limit's permits at once, like
	// semaphore.Weighted (0: one). The grant holds one slot per permit
	// (Lock.Slots). More than Limit, or with a Mode, is ErrInvalidArgument.
	Permits uint32
}

// The modes of a read/write lock's grant (AcquireOptions.Mode, Lock.Mode).
const (
	ModeRead  = pb.LockMode_LOCK_MODE_READ
	ModeWrite = pb.LockMode_LOCK_MODE_WRITE
)

func newHolder() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return "go-" + hex.EncodeToString(b)
}

func (c *Client) acquireRequest(name string, names []string, o AcquireOptions, waitMs uint64) *pb.AcquireRequest {
	req := &pb.AcquireRequest{Namespace: c.Namespace, Name: name, Names: names, Holder: o.Holder, Kind: o.Kind,
		Metadata: o.Metadata, WaitMs: waitMs, Priority: o.Priority, Mode: o.Mode, PreferReaders: o.PreferReaders}
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
	if o.Permits != 0 {
		req.Permits = proto.Uint32(o.Permits)
	}
	return req
}

// Acquire takes a permit, waiting up to o.WaitMs in the server. Cancelling
// ctx cancels the wait (the server drops the request at once). Without a
// deadline on ctx the call gets WaitMs plus DeadlineSlack, retries included.
// Errors: *NotAcquiredError (ErrBusy / ErrTimeout), *Error, ctx.Err().
func (c *Client) Acquire(ctx context.Context, name string, o AcquireOptions) (*Lock, error) {
	resp, sent, err := c.acquire(ctx, name, nil, &o)
	if err != nil {
		return nil, err
	}
	l := newLock(c, name, resp.Grant, sent)
	l.limit = o.Limit
	return l, nil
}

// acquire sends the Acquire of name (or, name empty, of the set names)
// with retries until it is answered; a grant, or the typed error. It fills
// o.Holder.
func (c *Client) acquire(ctx context.Context, name string, names []string, o *AcquireOptions) (*pb.AcquireResponse, time.Time, error) {
	if o.Holder == "" {
		o.Holder = newHolder()
	}
	label := name // what errors call it
	if names != nil {
		label = strings.Join(names, ",")
	}
	started := time.Now()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(o.WaitMs)*time.Millisecond+DeadlineSlack)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()
	var resp *pb.AcquireResponse
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
		var err error
		resp, err = c.Stub.Acquire(ctx, c.acquireRequest(name, names, *o, uint64(wait/time.Millisecond)))
		return err
	})
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return nil, sent, &NotAcquiredError{Name: label}
		}
		if ctx.Err() != nil {
			return nil, sent, ctx.Err()
		}
		return nil, sent, fromRPC(err)
	}
	if resp.Status == pb.AcquireStatus_ACQUIRE_STATUS_NOT_ACQUIRED {
		return nil, sent, &NotAcquiredError{Name: label, Response: resp}
	}
	if since := time.Now().Add(-50 * time.Millisecond); since.After(sent) {
		sent = since
	}
	return resp, sent, nil
}

// Inspect returns a lock's holders, limit and waiter count.
func (c *Client) Inspect(ctx context.Context, name string) (*pb.InspectResponse, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var resp *pb.InspectResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.Stub.Inspect(ctx, &pb.InspectRequest{Namespace: c.Namespace, Name: name})
		return err
	})
	return resp, wrap(err)
}

// Queue returns a lock's waiting requests in grant order.
func (c *Client) Queue(ctx context.Context, name string) (*pb.QueueResponse, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var resp *pb.QueueResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.Stub.Queue(ctx, &pb.QueueRequest{Namespace: c.Namespace, Name: name})
		return err
	})
	return resp, wrap(err)
}

func wrap(err error) error {
	if err == nil {
		return nil
	}
	return fromRPC(err)
}
