package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	tumbler "tumbler/client"
)

// transfer moves money between two accounts holding both of their locks,
// all or nothing; each write is fenced by its account's own token.
func transfer(ctx context.Context, c *tumbler.Client, from, to string, move func(fromToken, toToken uint64) error) error {
	return c.WithLocks(ctx, []string{from, to}, tumbler.AcquireOptions{WaitMs: 5000, TTLMs: 10000},
		func(ctx context.Context, set *tumbler.LockSet) error {
			fromToken, _ := set.FencingToken(from)
			toToken, _ := set.FencingToken(to)
			return move(fromToken, toToken)
		})
}

// holders counts the live grants of each lock.
func holders(c *tumbler.Client, names ...string) []int {
	out := []int{}
	for _, n := range names {
		info, err := c.Inspect(context.Background(), n)
		if err != nil {
			return nil
		}
		out = append(out, len(info.Holders))
	}
	return out
}

// waitQueued waits (up to 5 s) until holder's request is in name's queue.
func waitQueued(c *tumbler.Client, name, holder string) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if q, err := c.Queue(context.Background(), name); err == nil {
			for _, r := range q.Requests {
				if r.Holder == holder {
					return true
				}
			}
		}
	}
	return false
}

// multiChecks: the transfer pattern; all or nothing; extend and release of
// the set; a wait granted once the set it overlaps is released; a name
// twice refused naming names; a two-party cycle refused as ErrDeadlock.
func multiChecks(c *tumbler.Client) []check {
	var checks []check
	add := func(what string, ok bool, detail interface{}) { checks = append(checks, check{what, ok, detail}) }
	ctx := context.Background()

	var tokens []uint64
	err := transfer(ctx, c, "go.accounts/1", "go.accounts/2", func(fromToken, toToken uint64) error {
		tokens = []uint64{fromToken, toToken}
		return nil
	})
	add("multi-lock: a transfer holds both accounts, each with its fencing token",
		err == nil && len(tokens) == 2 && tokens[0] > 0 && tokens[1] > 0, fmt.Sprint(tokens, err))
	add("multi-lock: both accounts are free after the transfer",
		fmt.Sprint(holders(c, "go.accounts/1", "go.accounts/2")) == "[0 0]", holders(c, "go.accounts/1", "go.accounts/2"))

	var kept []int
	err = c.WithLocks(ctx, []string{"go.w1", "go.w2"}, tumbler.AcquireOptions{TTLMs: 600},
		func(ctx context.Context, set *tumbler.LockSet) error {
			time.Sleep(1200 * time.Millisecond) // twice the lease: only the watchdog's renewals of the set keep it
			kept = holders(c, "go.w1", "go.w2")
			return set.Err()
		})
	add("multi-lock: the watchdog keeps the set past its lease", err == nil && fmt.Sprint(kept) == "[1 1]",
		fmt.Sprint(kept, err))

	other, err := c.Acquire(ctx, "go.b", tumbler.AcquireOptions{Holder: "go-other", TTLMs: 30000})
	if err != nil {
		return append(checks, check{"multi-lock: a single lock for the busy case", false, err.Error()})
	}
	_, err = c.AcquireAll(ctx, []string{"go.a", "go.b", "go.c"}, tumbler.AcquireOptions{Holder: "go-set"})
	add("multi-lock: a set with one name held by another holder is ErrBusy and leaves the others unheld",
		errors.Is(err, tumbler.ErrBusy) && fmt.Sprint(holders(c, "go.a", "go.c")) == "[0 0]",
		fmt.Sprint(err, holders(c, "go.a", "go.c")))

	set, err := c.AcquireAll(ctx, []string{"go.a", "go.c"}, tumbler.AcquireOptions{Holder: "go-set", TTLMs: 5000})
	if err != nil {
		return append(checks, check{"multi-lock: a free set is granted", false, err.Error()})
	}
	grantNames := []string{}
	for _, g := range set.Grants() {
		grantNames = append(grantNames, g.Name)
	}
	add("multi-lock: the grants come one per name in the order asked, for one holder",
		fmt.Sprint(grantNames) == "[go.a go.c]" && set.Holder() == "go-set" && fmt.Sprint(set.Names()) == "[go.a go.c]",
		grantNames)
	before := set.ExpiresAtMs()
	err = set.Extend(ctx, 60000)
	add("multi-lock: Extend moves the set's lease", err == nil && set.ExpiresAtMs() > before+30000,
		fmt.Sprint(before, set.ExpiresAtMs(), err))

	waited := make(chan error, 1)
	var granted time.Time
	go func() {
		s, err := c.AcquireAll(ctx, []string{"go.c", "go.d"}, tumbler.AcquireOptions{Holder: "go-waiter", WaitMs: 10000, TTLMs: 5000})
		granted = time.Now()
		if err == nil {
			_, err = s.Release(ctx)
		}
		waited <- err
	}()
	queued := waitQueued(c, "go.c", "go-waiter") // its wake-up place in the busy lock's queue
	select {
	case err := <-waited:
		add("multi-lock: a set overlapping a held one waits", false, fmt.Sprint(err))
	default:
	}
	releasing := time.Now()
	released, err := set.Release(ctx)
	add("multi-lock: the overlapping set waits, its wake-up place in the queue", queued, nil)
	add("multi-lock: Release gives the whole set back",
		released && err == nil && fmt.Sprint(holders(c, "go.a")) == "[0]", fmt.Sprint(released, err))
	err = <-waited
	add("multi-lock: the waiting set is granted once the set it overlaps is released",
		err == nil && !granted.Before(releasing), fmt.Sprint(err))
	err = set.Extend(ctx, 0)
	add("multi-lock: Extend of a released set is ErrLockLost", errors.Is(err, tumbler.ErrLockLost), fmt.Sprint(err))
	released, err = c.ReleaseAll(ctx, []string{"go.b", "go.x"}, "go-other")
	add("multi-lock: ReleaseAll by holder frees what it holds, false when a name was not held",
		!released && err == nil && fmt.Sprint(holders(c, "go.b")) == "[0]", fmt.Sprint(released, err))
	_, _ = other.Release(ctx)

	_, err = c.AcquireAll(ctx, []string{"go.a", "go.a"}, tumbler.AcquireOptions{})
	var te *tumbler.Error
	add("multi-lock: a name twice is ErrInvalidArgument naming names",
		errors.Is(err, tumbler.ErrInvalidArgument) && errors.As(err, &te) && strings.HasPrefix(te.Message, "names"),
		fmt.Sprint(err))
	return append(checks, deadlockChecks(c)...)
}

// deadlockChecks: "go-a" holds go.x, "go-b" holds go.y; "go-b" waits for
// go.x (its wait is checked, and so recorded, after a tenth of its 5 s),
// then "go-a" asking go.y would close the cycle: refused as ErrDeadlock
// once its own check is due, long before its wait would end.
func deadlockChecks(c *tumbler.Client) []check {
	ctx := context.Background()
	x, errX := c.Acquire(ctx, "go.x", tumbler.AcquireOptions{Holder: "go-a", TTLMs: 30000})
	y, errY := c.Acquire(ctx, "go.y", tumbler.AcquireOptions{Holder: "go-b", TTLMs: 30000})
	if errX != nil || errY != nil {
		return []check{{"deadlock: two single locks", false, fmt.Sprint(errX, errY)}}
	}
	waited := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, "go.x", tumbler.AcquireOptions{Holder: "go-b", WaitMs: 5000, TTLMs: 30000})
		if err == nil {
			_, err = l.Release(ctx)
		}
		waited <- err
	}()
	queued := waitQueued(c, "go.x", "go-b")
	time.Sleep(time.Second) // well past go-b's check (a tenth of 5 s): its edge is recorded
	t0 := time.Now()
	_, err := c.Acquire(ctx, "go.y", tumbler.AcquireOptions{Holder: "go-a", WaitMs: 10000, TTLMs: 30000})
	took := time.Since(t0)
	var te *tumbler.Error
	checks := []check{
		{"deadlock: the first waiter is queued", queued, nil},
		{"deadlock: the wait closing a cycle is ErrDeadlock (ABORTED) naming it, long before its wait ends",
			tumbler.IsDeadlock(err) && errors.As(err, &te) && te.Code.String() == "Aborted" &&
				strings.HasPrefix(te.Message, "deadlock: ") && strings.Contains(te.Message, `"go-a"`) &&
				strings.Contains(te.Message, `"go-b"`) && took < 5*time.Second,
			fmt.Sprint(err, " after ", took)},
	}
	_, _ = x.Release(ctx)
	err = <-waited
	checks = append(checks, check{"deadlock: the other waiter is granted once the lock frees", err == nil, fmt.Sprint(err)})
	_, _ = y.Release(ctx)
	return checks
}
