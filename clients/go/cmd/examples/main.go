// The Go seed pattern of clients/go/README.md, run by the conformance driver:
// concurrency-limited workers that use their slot number.
// usage: examples ADDR NAMESPACE all   — prints {"checks": [...]} as one JSON line.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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

func main() {
	c, err := tumbler.Dial(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	c.Namespace = os.Args[2]
	b, _ := json.Marshal(map[string]interface{}{"checks": slotWorkers(c)})
	fmt.Println(string(b))
}
