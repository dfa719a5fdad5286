// pairs TARGET ADDR CALLERS PAIRS SECS
//
// The Go arms of bench/clients/run.sh: acquire+release pairs, try-once,
// each caller on its own lock name. TARGET `tumbler` (tumbler/client, one
// Client shared by CALLERS goroutines) or `redis` (redigo, Debian's
// github.com/gomodule/redigo: a redis.Pool, SET key token NX PX ttl, then
// compare-and-delete as a redis.Script, i.e. EVALSHA). A warm-up of 20
// pairs per caller, then up to PAIRS pairs in all, cut at SECS seconds.
// Prints "pairs=N secs=S"; a pair not granted and released fails the run.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gomodule/redigo/redis"
	tumbler "tumbler/client"
)

const ttlMs = 10000
const unlockSrc = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0"

func run(pair func(string) error, callers, total int, deadline time.Time) (int64, error) {
	var done int64
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		n := total / callers
		if i < total%callers {
			n++
		}
		wg.Add(1)
		go func(i, n int) {
			defer wg.Done()
			name := fmt.Sprintf("bench-go-%d-%d", os.Getpid(), i)
			for k := 0; k < n; k++ {
				if !deadline.IsZero() && !time.Now().Before(deadline) {
					return
				}
				if err := pair(name); err != nil {
					errs <- err
					return
				}
				atomic.AddInt64(&done, 1)
			}
		}(i, n)
	}
	wg.Wait()
	select {
	case err := <-errs:
		return done, err
	default:
		return done, nil
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "go: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 6 {
		fail("usage: pairs tumbler|redis ADDR CALLERS PAIRS SECS")
	}
	target, addr := os.Args[1], os.Args[2]
	callers, _ := strconv.Atoi(os.Args[3])
	pairs, _ := strconv.Atoi(os.Args[4])
	secs, _ := strconv.ParseFloat(os.Args[5], 64)
	ctx := context.Background()
	var pair func(string) error
	switch target {
	case "tumbler":
		c, err := tumbler.Dial(addr)
		if err != nil {
			fail("dial %s: %v", addr, err)
		}
		defer c.Close()
		pair = func(name string) error {
			l, err := c.Acquire(ctx, name, tumbler.AcquireOptions{TTLMs: ttlMs})
			if err != nil {
				return fmt.Errorf("acquire %s: %w", name, err)
			}
			ok, err := l.Release(ctx)
			if err != nil || !ok {
				return fmt.Errorf("release %s: held %v, %v", name, ok, err)
			}
			return nil
		}
	case "redis":
		pool := &redis.Pool{MaxIdle: callers + 1, Dial: func() (redis.Conn, error) { return redis.Dial("tcp", addr) }}
		defer pool.Close()
		unlock := redis.NewScript(1, unlockSrc)
		pair = func(name string) error {
			var b [16]byte
			if _, err := rand.Read(b[:]); err != nil {
				return err
			}
			token := hex.EncodeToString(b[:])
			conn := pool.Get()
			defer conn.Close()
			if ok, err := redis.String(conn.Do("SET", name, token, "NX", "PX", ttlMs)); err != nil || ok != "OK" {
				return fmt.Errorf("SET %s: %q %v", name, ok, err)
			}
			if n, err := redis.Int(unlock.Do(conn, name, token)); err != nil || n != 1 {
				return fmt.Errorf("unlock %s: %d %v", name, n, err)
			}
			return nil
		}
	default:
		fail("unknown target %s", target)
	}
	if _, err := run(pair, callers, 20*callers, time.Time{}); err != nil {
		fail("%s: %v", target, err)
	}
	start := time.Now()
	done, err := run(pair, callers, pairs, start.Add(time.Duration(secs*float64(time.Second))))
	if err != nil {
		fail("%s: %v", target, err)
	}
	fmt.Printf("pairs=%d secs=%.6f\n", done, time.Since(start).Seconds())
}
