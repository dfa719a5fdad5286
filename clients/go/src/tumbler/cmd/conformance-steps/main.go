// Go's steps of the cross-language conformance scenario (clients/conformance).
// usage: conformance-steps ADDR NAMESPACE STEP ARGS...   — prints one JSON line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc/status"

	"tumbler"
	pb "tumbler/tumblerv1"
)

type obj = map[string]interface{}

func grantJSON(l *tumbler.Lock) obj {
	return obj{"holder": l.Holder(), "token": strconv.FormatUint(l.FencingToken(), 10), "slot": l.Slot(),
		"acquired_at_ms": l.Grant.AcquiredAtMs}
}

func atoi(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }

func run(c *tumbler.Client, step string, args []string) (obj, error) {
	ctx := context.Background()
	switch step {
	case "hold": // NAME HOLDER LIMIT
		l, err := c.Acquire(ctx, args[0], tumbler.AcquireOptions{Holder: args[1], Limit: uint32(atoi(args[2])), TTLMs: 60000})
		var na *tumbler.NotAcquiredError
		if errors.As(err, &na) {
			st := "TIMEOUT"
			if na.Busy() {
				st = "BUSY"
			}
			return obj{"status": st, "holders": na.Response.Holders}, nil
		} else if err != nil {
			return nil, err
		}
		out := grantJSON(l)
		out["status"] = "ACQUIRED"
		return out, nil
	case "release": // NAME HOLDER
		resp, err := c.Stub.Release(ctx, &pb.ReleaseRequest{Namespace: c.Namespace, Name: args[0], Holder: args[1]})
		if err != nil {
			return nil, err
		}
		return obj{"released": resp.Status == pb.ReleaseStatus_RELEASE_STATUS_RELEASED}, nil
	case "wait": // NAME HOLDER WAIT_MS HOLD_MS
		var out obj
		err := c.WithLock(ctx, args[0], tumbler.AcquireOptions{Holder: args[1], WaitMs: atoi(args[2]), TTLMs: 60000},
			func(l *tumbler.Lock) error {
				out = grantJSON(l)
				time.Sleep(time.Duration(atoi(args[3])) * time.Millisecond)
				out["released_at_ms"] = time.Now().UnixMilli()
				return nil
			})
		return out, err
	case "scoped": // NAME
		var out obj
		err := c.WithLock(ctx, args[0], tumbler.AcquireOptions{TTLMs: 2000}, func(l *tumbler.Lock) error {
			out = grantJSON(l)
			before := l.Grant.ExpiresAtMs
			time.Sleep(50 * time.Millisecond)
			if err := l.Extend(ctx, 30000); err != nil {
				return err
			}
			out["extended"] = l.Grant.ExpiresAtMs > before
			return nil
		})
		if err != nil {
			return nil, err
		}
		info, err := c.Stub.Inspect(ctx, &pb.InspectRequest{Namespace: c.Namespace, Name: args[0]})
		if err != nil {
			return nil, err
		}
		out["holders_after"] = len(info.Holders)
		return out, nil
	case "inspect": // NAME
		info, err := c.Stub.Inspect(ctx, &pb.InspectRequest{Namespace: c.Namespace, Name: args[0]})
		if err != nil {
			return nil, err
		}
		q, err := c.Stub.Queue(ctx, &pb.QueueRequest{Namespace: c.Namespace, Name: args[0]})
		if err != nil {
			return nil, err
		}
		holders := []obj{}
		for _, h := range info.Holders {
			holders = append(holders, obj{"holder": h.Grant.Holder, "token": strconv.FormatUint(h.Grant.FencingToken, 10), "slot": h.Grant.Slot})
		}
		queue := []string{}
		for _, r := range q.Requests {
			queue = append(queue, r.Holder)
		}
		return obj{"limit": info.Limit, "waiters": info.Waiters, "holders": holders, "queue": queue}, nil
	case "invalid": // bad input: limit 0
		_, err := c.Stub.Acquire(ctx, &pb.AcquireRequest{Namespace: c.Namespace, Name: "conformance-invalid", Limit: new(uint32)})
		st, _ := status.FromError(err)
		code := st.Code().String() // "InvalidArgument"
		return obj{"field": "limit", "code": code, "message": st.Message()}, nil
	}
	return nil, fmt.Errorf("unknown step %s", step)
}

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: conformance-steps ADDR NAMESPACE STEP ARGS...")
		os.Exit(2)
	}
	c, err := tumbler.Dial(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	c.Namespace = os.Args[2]
	out, err := run(c, os.Args[3], os.Args[4:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
