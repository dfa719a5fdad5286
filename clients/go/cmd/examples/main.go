// The Go seed patterns of clients/go/README.md, run by the conformance driver:
// concurrency-limited workers that use their slot number, one leader
// among replicas (leader election), weighted permits, and a transfer
// holding two accounts' locks at once (multi-lock, multi.go, with the
// deadlock error).
// usage: examples ADDR NAMESPACE all   — prints {"checks": [...]} as one JSON line.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	tumbler "tumbler/client"
)

// renderJob runs one job on the render farm: at most 3 at once, across every
// process that uses the lock. The slot (1..3) says which of the 3 scratch
// devices is this job's alone while it holds the permit.
func renderJob(ctx context.Context, c *tumbler.Client, jobID string, work func(slot uint32) error) error {
	return c.WithLock(ctx, "render-farm", tumbler.AcquireOptions{
		Holder: jobID, Limit: 3, WaitMs: 30000, TTLMs: 60000, Kind: "render",
	}, func(ctx context.Context, l *tumbler.Lock) error {
		return work(l.Slot())
	})
}

// runAsLeader runs work while this replica leads the election; (false, nil)
// when another one led for the whole wait. The value others see is this
// replica's address. work's ctx is cancelled if the term ends under it.
func runAsLeader(ctx context.Context, c *tumbler.Client, election, me string,
	work func(ctx context.Context, l *tumbler.Leadership) error) (bool, error) {
	l, err := c.Campaign(ctx, election, tumbler.CampaignOptions{Value: me, WaitMs: 5000, TTLMs: 3000})
	if err != nil || l == nil {
		return false, err
	}
	defer l.Resign(context.Background()) // the next replica in line is elected at once
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-l.Lost():
			cancel()
		case <-ctx.Done():
		}
	}()
	return true, work(ctx, l)
}

func electionChecks(c *tumbler.Client) []check {
	var checks []check
	add := func(what string, ok bool, detail interface{}) { checks = append(checks, check{what, ok, detail}) }
	var term uint64
	elected, err := runAsLeader(context.Background(), c, "go.scheduler", "10.0.0.7:8080",
		func(ctx context.Context, l *tumbler.Leadership) error {
			term = l.Term()
			now, err := c.Leader(ctx, "go.scheduler")
			add("leader election: leader() shows this replica's value and term",
				err == nil && now != nil && now.Value == "10.0.0.7:8080" && now.Term == l.Term(), fmt.Sprint(now, err))
			other, err := c.Campaign(ctx, "go.scheduler", tumbler.CampaignOptions{Value: "10.0.0.8:8080"})
			add("leader election: another replica is not elected while this one leads", err == nil && other == nil, err)
			var first string
			var firstTerm uint64
			err = c.Observe(ctx, "go.scheduler", func(change *tumbler.LeaderChange) bool {
				first, firstTerm = change.Event, change.Leader.GetTerm()
				return false
			})
			add("leader election: observe starts with the current leader",
				err == nil && first == "current" && firstTerm == l.Term(), first)
			return l.Proclaim(ctx, "10.0.0.7:9090")
		})
	add("leader election: elected, with a term (fencing token)", elected && err == nil && term > 0, fmt.Sprint(term, err))
	now, err := c.Leader(context.Background(), "go.scheduler")
	add("leader election: nobody leads after resign", err == nil && now == nil, fmt.Sprint(now, err))
	return checks
}

type check struct {
	What   string      `json:"what"`
	OK     bool        `json:"ok"`
	Detail interface{} `json:"detail,omitempty"`
}

func slotWorkers(c *tumbler.Client) []check {
	const jobs = 8
	var inUse [4]int32 // inUse[slot] is 1 while a job works on that device
	var running, peak, clashes, done int32
	var badSlot int32
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for i := 0; i < jobs; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := renderJob(context.Background(), c, fmt.Sprintf("render-job-%d", i), func(slot uint32) error {
				if slot < 1 || slot > 3 {
					atomic.AddInt32(&badSlot, 1)
					return nil
				}
				if !atomic.CompareAndSwapInt32(&inUse[slot], 0, 1) {
					atomic.AddInt32(&clashes, 1) // another job on the same device: must never happen
				}
				n := atomic.AddInt32(&running, 1)
				for p := atomic.LoadInt32(&peak); n > p && !atomic.CompareAndSwapInt32(&peak, p, n); p = atomic.LoadInt32(&peak) {
				}
				time.Sleep(300 * time.Millisecond) // the render
				atomic.AddInt32(&running, -1)
				atomic.StoreInt32(&inUse[slot], 0)
				atomic.AddInt32(&done, 1)
				return nil
			})
			if err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	var errList []string
	for err := range errs {
		errList = append(errList, err.Error())
	}
	return []check{
		{"slot workers: 8 jobs through a limit-3 lock all ran", done == jobs && len(errList) == 0, map[string]interface{}{"done": done, "errors": errList}},
		{"slot workers: never more than 3 at once, and 3 did run together", peak == 3, map[string]interface{}{"peak": peak}},
		{"slot workers: each slot in 1..3, never two jobs on one slot", done == jobs && badSlot == 0 && clashes == 0, map[string]interface{}{"bad_slot": badSlot, "clashes": clashes}},
	}
}

// weightedChecks: a big export takes 3 of 10 permits, small ones share the
// rest; 11 of 10 is ErrInvalidArgument with the server's message.
func weightedChecks(c *tumbler.Client) []check {
	var checks []check
	add := func(what string, ok bool, detail interface{}) { checks = append(checks, check{what, ok, detail}) }
	ctx := context.Background()
	err := c.WithLock(ctx, "go.exports", tumbler.AcquireOptions{Limit: 10, Permits: 3, TTLMs: 600},
		func(ctx context.Context, big *tumbler.Lock) error {
			time.Sleep(500 * time.Millisecond) // near the end of the lease: the watchdog has renewed it by now
			add("weighted permits: a big job holds 3 of 10, one slot per permit, kept across renewals",
				big.Permits() == 3 && fmt.Sprint(big.Slots()) == "[1 2 3]", big.Slots())
			var slots []uint32
			for i := 0; i < 7; i++ {
				small, err := c.Acquire(ctx, "go.exports", tumbler.AcquireOptions{Limit: 10, TTLMs: 5000})
				if err != nil {
					return err
				}
				defer small.Release(ctx)
				if small.Permits() == 1 && len(small.Slots()) == 1 {
					slots = append(slots, small.Slot())
				}
			}
			sort.Slice(slots, func(i, j int) bool { return slots[i] < slots[j] })
			add("weighted permits: seven small jobs take the other slots, 4..10",
				fmt.Sprint(slots) == "[4 5 6 7 8 9 10]", slots)
			info, err := c.Inspect(ctx, "go.exports")
			add("weighted permits: inspect counts 10 permits in use", err == nil && info.PermitsInUse == 10,
				fmt.Sprint(info.GetPermitsInUse(), err))
			_, err = c.Acquire(ctx, "go.exports", tumbler.AcquireOptions{Limit: 10})
			add("weighted permits: an 11th permit is busy", errors.Is(err, tumbler.ErrBusy), fmt.Sprint(err))
			return nil
		})
	add("weighted permits: the big job ran", err == nil, fmt.Sprint(err))
	_, err = c.Acquire(ctx, "go.exports", tumbler.AcquireOptions{Limit: 10, Permits: 11})
	var te *tumbler.Error
	add("weighted permits: 11 of 10 is ErrInvalidArgument with the server's message",
		errors.Is(err, tumbler.ErrInvalidArgument) && errors.As(err, &te) && strings.HasPrefix(te.Message, "permits"),
		fmt.Sprint(err))
	return checks
}

func main() {
	c, err := tumbler.Dial(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	c.Namespace = os.Args[2]
	checks := append(append(append(slotWorkers(c), electionChecks(c)...), weightedChecks(c)...), multiChecks(c)...)
	b, _ := json.Marshal(map[string]interface{}{"checks": checks})
	fmt.Println(string(b))
}
