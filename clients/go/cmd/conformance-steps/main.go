// Go's steps of the cross-language conformance scenario (clients/conformance).
// usage: conformance-steps ADDR NAMESPACE STEP ARGS...
// Prints JSON lines: events ({"event": ...}) while it runs, its result last.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	tumbler "tumbler/client"
	pb "tumbler/client/tumblerv1"
)

type obj = map[string]interface{}

func emit(v interface{}) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func grantJSON(l *tumbler.Lock) obj {
	g := l.Grant()
	return obj{"holder": g.Holder, "token": strconv.FormatUint(g.FencingToken, 10), "slot": g.Slot,
		"acquired_at_ms": g.AcquiredAtMs}
}

func atoi(s string) uint64 { n, _ := strconv.ParseUint(s, 10, 64); return n }
func nowMs() int64         { return time.Now().UnixMilli() }

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func with(out obj, kv ...interface{}) obj {
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

var steps = map[string]func(c *tumbler.Client, a []string) (obj, error){
	"hold":          hold,
	"rw_hold":       rwHold,
	"rw_wait":       rwWait,
	"weighted_hold": weightedHold,
	"weighted_wait": weightedWait,
	"multi_hold":    multiHold,
	"multi_wait":    multiWait,
	"multi_release": multiRelease,
	"multi_stale":   multiStale,
	"deadlock_wait": deadlockWait,
	"release":       release,
	"wait":          wait,
	"scoped":        scoped,
	"inspect":       inspect,
	"invalid":       invalid,
	"keep":          keep,
	"crash":         crash,
	"lost":          lost,
	"cancel":        cancel,
	"restart":       restart,
	"campaign":      campaign,
	"leader":        leader,
	"observe":       observe,
}

func leadershipJSON(l *pb.Leadership) interface{} {
	if l == nil {
		return nil
	}
	return obj{"candidate": l.Candidate, "term": strconv.FormatUint(l.Term, 10), "value": l.Value,
		"elected_at_ms": l.ElectedAtMs, "expires_at_ms": l.ExpiresAtMs}
}

func lostNow(l *tumbler.Leadership) bool {
	select {
	case <-l.Lost():
		return true
	default:
		return false
	}
}

// campaign: NAME CANDIDATE VALUE TTL_MS WAIT_MS, then commands on stdin.
func campaign(c *tumbler.Client, a []string) (obj, error) {
	l, err := c.Campaign(context.Background(), a[0], tumbler.CampaignOptions{Candidate: a[1], Value: a[2],
		TTLMs: atoi(a[3]), WaitMs: atoi(a[4])})
	if err != nil {
		return nil, err
	}
	if l == nil {
		return obj{"elected": false}, nil
	}
	emit(with(leadershipJSON(l.Leader()).(obj), "event", "elected", "elected", true, "at_ms", nowMs()))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(in.Text()), " ")
		switch cmd {
		case "proclaim":
			err := l.Proclaim(context.Background(), arg)
			var nl *tumbler.NotLeaderError
			if errors.As(err, &nl) {
				emit(obj{"event": "proclaim", "status": "NOT_LEADER", "typed": "NotLeaderError", "lost": lostNow(l)})
			} else if err != nil {
				return nil, err
			} else {
				emit(obj{"event": "proclaim", "status": "PROCLAIMED", "value": l.Value(), "lost": lostNow(l)})
			}
		case "resign":
			first, err := l.Resign(context.Background())
			if err != nil {
				return nil, err
			}
			second, err := l.Resign(context.Background())
			if err != nil {
				return nil, err
			}
			emit(obj{"event": "resign", "first": first, "second": second, "lost": lostNow(l)})
		case "lost":
			lost := false
			select {
			case <-l.Lost():
				lost = true
			case <-time.After(time.Duration(atoi(arg)) * time.Millisecond):
			}
			reason := ""
			var nl *tumbler.NotLeaderError
			if errors.As(l.Err(), &nl) {
				reason = nl.Reason
			}
			emit(obj{"event": "lost", "lost": lost, "reason": reason, "at_ms": nowMs()})
		case "exit":
			_, _ = l.Resign(context.Background())
			return obj{"done": true, "term": strconv.FormatUint(l.Term(), 10)}, nil
		}
	}
	_, _ = l.Resign(context.Background())
	return obj{"done": true, "term": strconv.FormatUint(l.Term(), 10)}, nil
}

func leader(c *tumbler.Client, a []string) (obj, error) { // NAME
	l, err := c.Leader(context.Background(), a[0])
	if err != nil {
		return nil, err
	}
	return obj{"leader": leadershipJSON(l)}, nil
}

func observe(c *tumbler.Client, a []string) (obj, error) { // NAME STOP_CANDIDATE TIMEOUT_MS
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(atoi(a[2]))*time.Millisecond)
	defer cancel()
	changes, cancelled := []obj{}, false
	err := c.Observe(ctx, a[0], func(change *pb.LeaderChange) bool {
		seen := obj{"kind": change.Event, "leader": leadershipJSON(change.Leader),
			"ended_term": strconv.FormatUint(change.EndedTerm, 10)}
		changes = append(changes, seen)
		emit(with(obj{"event": "change"}, "kind", seen["kind"], "leader", seen["leader"], "ended_term", seen["ended_term"]))
		if change.Event == "elected" && change.Leader.GetCandidate() == a[1] {
			cancelled = true
			return false
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	return obj{"cancelled": cancelled, "changes": changes}, nil
}

func hold(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER LIMIT
	l, err := c.Acquire(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], Limit: uint32(atoi(a[2])), TTLMs: 60000})
	var na *tumbler.NotAcquiredError
	if errors.As(err, &na) {
		st := "TIMEOUT"
		if errors.Is(err, tumbler.ErrBusy) {
			st = "BUSY"
		}
		return obj{"status": st, "holders": na.Response.Holders}, nil
	} else if err != nil {
		return nil, err
	}
	return with(grantJSON(l), "status", "ACQUIRED"), nil
}

func modeOf(name string) pb.LockMode {
	switch name {
	case "read":
		return tumbler.ModeRead
	case "write":
		return tumbler.ModeWrite
	}
	return pb.LockMode_LOCK_MODE_UNSPECIFIED
}

func modeName(l *tumbler.Lock) interface{} {
	switch l.Mode() {
	case tumbler.ModeRead:
		return "read"
	case tumbler.ModeWrite:
		return "write"
	}
	return nil
}

// tryOnce reports a try-once acquire kept (60 s lease): ACQUIRED with out(l), BUSY, or the error.
func tryOnce(l *tumbler.Lock, err error, out func(l *tumbler.Lock) obj) (obj, error) {
	var na *tumbler.NotAcquiredError
	var te *tumbler.Error
	if errors.As(err, &na) {
		st := "TIMEOUT"
		if errors.Is(err, tumbler.ErrBusy) {
			st = "BUSY"
		}
		return obj{"status": st, "holders": na.Response.Holders}, nil
	} else if errors.As(err, &te) {
		return obj{"status": "ERROR", "code": te.Code.String(), "typed": "*tumbler.Error", "message": te.Message}, nil
	} else if err != nil {
		return nil, err
	}
	res := with(grantJSON(l), "status", "ACQUIRED")
	for k, v := range out(l) {
		res[k] = v
	}
	return res, nil
}

func rwHold(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER read|write|plain: try once, keep the grant
	l, err := c.Acquire(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], TTLMs: 60000, Mode: modeOf(a[2])})
	return tryOnce(l, err, func(l *tumbler.Lock) obj { return obj{"mode": modeName(l)} })
}

func weights(l *tumbler.Lock) obj { return obj{"permits": l.Permits(), "slots": l.Slots()} }

func weightedHold(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER LIMIT PERMITS: try once, keep the grant
	l, err := c.Acquire(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], TTLMs: 60000,
		Limit: uint32(atoi(a[2])), Permits: uint32(atoi(a[3]))})
	return tryOnce(l, err, weights)
}

func weightedWait(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER LIMIT PERMITS WAIT_MS HOLD_MS
	var out obj
	err := c.WithLock(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], WaitMs: atoi(a[4]),
		TTLMs: 60000, Limit: uint32(atoi(a[2])), Permits: uint32(atoi(a[3]))},
		func(ctx context.Context, l *tumbler.Lock) error {
			out = grantJSON(l)
			for k, v := range weights(l) {
				out[k] = v
			}
			if err := l.Extend(ctx, 0); err != nil {
				return err
			}
			out["extended"] = weights(l)
			time.Sleep(time.Duration(atoi(a[5])) * time.Millisecond)
			out["released_at_ms"] = nowMs()
			return nil
		})
	return out, err
}

func setJSON(s *tumbler.LockSet) obj {
	grants := []obj{}
	for _, g := range s.Grants() {
		grants = append(grants, obj{"name": g.Name, "token": strconv.FormatUint(g.FencingToken, 10), "slot": g.Slot})
	}
	return obj{"status": "ACQUIRED", "holder": s.Holder(), "grants": grants}
}

// notGranted reports BUSY, TIMEOUT or an *Error as weighted_hold does; ok false for anything else.
func notGranted(err error) (obj, bool) {
	var na *tumbler.NotAcquiredError
	var te *tumbler.Error
	switch {
	case errors.Is(err, tumbler.ErrBusy):
		return obj{"status": "BUSY"}, true
	case errors.As(err, &na):
		return obj{"status": "TIMEOUT"}, true
	case errors.As(err, &te):
		return obj{"status": "ERROR", "code": te.Code.String(), "typed": "*tumbler.Error", "message": te.Message}, true
	}
	return nil, false
}

func multiHold(c *tumbler.Client, a []string) (obj, error) { // HOLDER NAMES: try once, keep the set (60 s lease)
	s, err := c.AcquireAll(context.Background(), strings.Split(a[1], ","), tumbler.AcquireOptions{Holder: a[0], TTLMs: 60000})
	if out, ok := notGranted(err); ok {
		return out, nil
	} else if err != nil {
		return nil, err
	}
	return setJSON(s), nil
}

func multiWait(c *tumbler.Client, a []string) (obj, error) { // HOLDER NAMES WAIT_MS HOLD_MS
	var out obj
	err := c.WithLocks(context.Background(), strings.Split(a[1], ","),
		tumbler.AcquireOptions{Holder: a[0], WaitMs: atoi(a[2]), TTLMs: 60000},
		func(ctx context.Context, s *tumbler.LockSet) error {
			out = setJSON(s)
			out["extended"] = s.Extend(ctx, 0) == nil
			time.Sleep(time.Duration(atoi(a[3])) * time.Millisecond)
			out["released_at_ms"] = nowMs()
			return nil
		})
	if res, ok := notGranted(err); ok {
		return res, nil
	}
	return out, err
}

func multiRelease(c *tumbler.Client, a []string) (obj, error) { // HOLDER NAMES
	released, err := c.ReleaseAll(context.Background(), strings.Split(a[1], ","), a[0])
	return obj{"released": released}, err
}

// multiStale: HOLDER NAMES. S1 taken and released, S2 taken, S1's release
// again (the stale one); on a line from stdin, S2 released.
func multiStale(c *tumbler.Client, a []string) (obj, error) {
	ctx, names := context.Background(), strings.Split(a[1], ",")
	o := tumbler.AcquireOptions{Holder: a[0], TTLMs: 60000}
	first, err := c.AcquireAll(ctx, names, o)
	if err != nil {
		return nil, err
	}
	firstReleased, err := first.Release(ctx)
	if err != nil {
		return nil, err
	}
	second, err := c.AcquireAll(ctx, names, o)
	if err != nil {
		return nil, err
	}
	stale, err := first.Release(ctx)
	if err != nil {
		return nil, err
	}
	emit(obj{"event": "stale", "first": setJSON(first), "second": setJSON(second), "first_released": firstReleased,
		"stale_released": stale})
	bufio.NewScanner(os.Stdin).Scan()
	released, err := second.Release(ctx)
	return obj{"released": released}, err
}

func deadlockWait(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER WAIT_MS: caught as ErrDeadlock
	l, err := c.Acquire(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], WaitMs: atoi(a[2]), TTLMs: 60000})
	var te *tumbler.Error
	if errors.Is(err, tumbler.ErrDeadlock) && errors.As(err, &te) {
		return obj{"status": "DEADLOCK", "typed": "ErrDeadlock", "code": te.Code.String(), "message": te.Message}, nil
	}
	if out, ok := notGranted(err); ok {
		return out, nil
	} else if err != nil {
		return nil, err
	}
	out := obj{"status": "ACQUIRED", "token": strconv.FormatUint(l.FencingToken(), 10)}
	_, err = l.Release(context.Background())
	return out, err
}

func rwWait(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER MODE WAIT_MS HOLD_MS
	var out obj
	err := c.WithLock(context.Background(), a[0],
		tumbler.AcquireOptions{Holder: a[1], WaitMs: atoi(a[3]), TTLMs: 60000, Mode: modeOf(a[2])},
		func(ctx context.Context, l *tumbler.Lock) error {
			out = with(grantJSON(l), "mode", modeName(l))
			time.Sleep(time.Duration(atoi(a[4])) * time.Millisecond)
			out["released_at_ms"] = nowMs()
			return nil
		})
	return out, err
}

func release(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER
	resp, err := c.Stub.Release(context.Background(), &pb.ReleaseRequest{Namespace: c.Namespace, Name: a[0], Holder: a[1]})
	if err != nil {
		return nil, err
	}
	return obj{"released": resp.Status == pb.ReleaseStatus_RELEASE_STATUS_RELEASED}, nil
}

func wait(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER WAIT_MS HOLD_MS
	var out obj
	err := c.WithLock(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], WaitMs: atoi(a[2]), TTLMs: 60000},
		func(ctx context.Context, l *tumbler.Lock) error {
			out = grantJSON(l)
			time.Sleep(time.Duration(atoi(a[3])) * time.Millisecond)
			out["released_at_ms"] = nowMs()
			return nil
		})
	return out, err
}

func scoped(c *tumbler.Client, a []string) (obj, error) { // NAME
	var out obj
	err := c.WithLock(context.Background(), a[0], tumbler.AcquireOptions{TTLMs: 2000}, func(ctx context.Context, l *tumbler.Lock) error {
		out = grantJSON(l)
		before := l.Grant().ExpiresAtMs
		time.Sleep(50 * time.Millisecond)
		if err := l.Extend(ctx, 30000); err != nil {
			return err
		}
		out["extended"] = l.Grant().ExpiresAtMs > before
		return nil
	})
	if err != nil {
		return nil, err
	}
	info, err := c.Inspect(context.Background(), a[0])
	if err != nil {
		return nil, err
	}
	return with(out, "holders_after", len(info.Holders)), nil
}

func inspect(c *tumbler.Client, a []string) (obj, error) { // NAME
	info, err := c.Inspect(context.Background(), a[0])
	if err != nil {
		return nil, err
	}
	q, err := c.Queue(context.Background(), a[0])
	if err != nil {
		return nil, err
	}
	holders := []obj{}
	for _, h := range info.Holders {
		holders = append(holders, obj{"holder": h.Grant.Holder, "token": strconv.FormatUint(h.Grant.FencingToken, 10), "slot": h.Grant.Slot})
	}
	return obj{"limit": info.Limit, "waiters": info.Waiters, "holders": holders, "queue": holderNames(q)}, nil
}

func holderNames(q *pb.QueueResponse) []string {
	out := []string{}
	for _, r := range q.Requests {
		out = append(out, r.Holder)
	}
	return out
}

func invalid(c *tumbler.Client, a []string) (obj, error) { // bad input: limit above the maximum
	_, err := c.Acquire(context.Background(), "conformance-invalid", tumbler.AcquireOptions{Limit: 1 << 30})
	var te *tumbler.Error
	if !errors.As(err, &te) || !errors.Is(err, tumbler.ErrInvalidArgument) {
		return obj{"field": "limit", "code": fmt.Sprint(err)}, nil
	}
	return obj{"field": "limit", "code": te.Code.String(), "message": te.Message, "typed": "ErrInvalidArgument"}, nil
}

func keep(c *tumbler.Client, a []string) (obj, error) { // NAME TTL_MS WORK_MS: lease shorter than the work
	var out obj
	err := c.WithLock(context.Background(), a[0], tumbler.AcquireOptions{Holder: "go-keeper", TTLMs: atoi(a[1])},
		func(ctx context.Context, l *tumbler.Lock) error {
			emit(with(grantJSON(l), "event", "held"))
			start := nowMs()
			if err := sleepCtx(ctx, time.Duration(atoi(a[2]))*time.Millisecond); err != nil {
				return err
			}
			info, err := c.Inspect(ctx, a[0])
			if err != nil || len(info.Holders) == 0 {
				return fmt.Errorf("inspect inside the body: %v", err)
			}
			out = obj{"body_start_ms": start, "body_end_ms": nowMs(), "token": strconv.FormatUint(l.FencingToken(), 10),
				"lost": l.Err() != nil, "token_inside": strconv.FormatUint(info.Holders[0].Grant.FencingToken, 10)}
			return nil
		})
	if err != nil {
		return nil, err
	}
	info, err := c.Inspect(context.Background(), a[0])
	if err != nil {
		return nil, err
	}
	// Its own grant only: the driver's prober may take the freed lock at once.
	mine := 0
	for _, h := range info.Holders {
		if h.Grant.Holder == "go-keeper" {
			mine++
		}
	}
	return with(out, "holders_after", mine), nil
}

func crash(c *tumbler.Client, a []string) (obj, error) { // NAME TTL_MS: get killed while holding
	err := c.WithLock(context.Background(), a[0], tumbler.AcquireOptions{Holder: "go-crasher", TTLMs: atoi(a[1])},
		func(ctx context.Context, l *tumbler.Lock) error {
			emit(with(grantJSON(l), "event", "held"))
			return sleepCtx(ctx, time.Minute)
		})
	return obj{"survived": true}, err
}

func lost(c *tumbler.Client, a []string) (obj, error) { // NAME TTL_MS: the driver takes the grant away
	out := obj{"signalled": false}
	err := c.WithLock(context.Background(), a[0], tumbler.AcquireOptions{Holder: "go-loser", TTLMs: atoi(a[1])},
		func(ctx context.Context, l *tumbler.Lock) error {
			emit(with(grantJSON(l), "event", "held"))
			if err := sleepCtx(ctx, 10*time.Second); err != nil {
				with(out, "signalled", true, "signal_at_ms", nowMs(), "reason", l.Err().Error())
			}
			return nil
		})
	if errors.Is(err, tumbler.ErrLockLost) {
		out["raised"] = "ErrLockLost"
	}
	return out, nil
}

func cancel(c *tumbler.Client, a []string) (obj, error) { // NAME AFTER_MS: cancel a waiting acquire
	holder := "go-canceller"
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	res := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, a[0], tumbler.AcquireOptions{Holder: holder, WaitMs: 20000, TTLMs: 10000})
		res <- err
	}()
	time.Sleep(time.Duration(atoi(a[1])) * time.Millisecond)
	q, err := c.Queue(context.Background(), a[0])
	if err != nil {
		return nil, err
	}
	before := holderNames(q)
	t0 := time.Now()
	stop()
	err = <-res
	out := obj{"error": fmt.Sprint(err), "cancel_ms": time.Since(t0).Milliseconds(), "queued_before": contains(before, holder)}
	if errors.Is(err, context.Canceled) {
		out["error"] = "context.Canceled"
	}
	after, err := queueWithout(c, a[0], holder, t0)
	return with(out, "queue_after", after, "gone_ms", time.Since(t0).Milliseconds()), err
}

// queueWithout polls the queue (up to 2 s) until holder has left it.
func queueWithout(c *tumbler.Client, name, holder string, t0 time.Time) ([]string, error) {
	for {
		q, err := c.Queue(context.Background(), name)
		if err != nil {
			return nil, err
		}
		if names := holderNames(q); !contains(names, holder) || time.Since(t0) > 2*time.Second {
			return names, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func restart(c *tumbler.Client, a []string) (obj, error) { // NAME HOLDER WAIT_MS: wait through a restart
	started := time.Now()
	l, err := c.Acquire(context.Background(), a[0], tumbler.AcquireOptions{Holder: a[1], WaitMs: atoi(a[2]), TTLMs: 30000})
	if err != nil {
		return nil, err
	}
	out := with(grantJSON(l), "status", "ACQUIRED", "elapsed_ms", time.Since(started).Milliseconds())
	_, err = l.Release(context.Background())
	return out, err
}

// auth: the token is sent; none, or another namespace, is ErrPermissionDenied.
func auth(addr, namespace, token string) (obj, error) {
	attempt := func(ns, tok string) string {
		c, err := tumbler.Dial(addr)
		if err != nil {
			return err.Error()
		}
		defer c.Close()
		c.Namespace, c.Token = ns, tok
		l, err := c.Acquire(context.Background(), "auth-go", tumbler.AcquireOptions{TTLMs: 5000})
		switch {
		case err == nil:
			_, _ = l.Release(context.Background())
			return "ACQUIRED"
		case errors.Is(err, tumbler.ErrPermissionDenied):
			return "ErrPermissionDenied"
		}
		return err.Error()
	}
	return obj{"with_token": attempt(namespace, token), "no_token": attempt(namespace, ""),
		"other_namespace": attempt("elsewhere", token)}, nil
}

func main() {
	if len(os.Args) == 5 && os.Args[3] == "auth" {
		out, _ := auth(os.Args[1], os.Args[2], os.Args[4])
		emit(out)
		return
	}
	if len(os.Args) < 4 || steps[os.Args[3]] == nil {
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
	out, err := steps[os.Args[3]](c, os.Args[4:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	emit(out)
}
