// The baseline `/leader` is measured against (`cargo bench --bench failover
// -- --only wrk`): Go's net/http answering what leader-gate's `/leader`
// answers — the same JSON fields, built per request from a state that a
// goroutine renews every 2 s, as the sidecar's election does. Standard
// library only; the bench builds it with `go build` when `go` is on PATH.
package main

import (
	"encoding/json"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

type leaseRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Shard     int    `json:"shard"`
	Shards    int    `json:"shards"`
}

type validUntil struct {
	BoottimeMs int64  `json:"boottime_ms"`
	Clock      string `json:"clock"`
}

type body struct {
	Leading          bool       `json:"leading"`
	Identity         string     `json:"identity"`
	Holder           *string    `json:"holder"`
	Lease            leaseRef   `json:"lease"`
	Term             *string    `json:"term"`
	Since            string     `json:"since"`
	ValidForMs       int64      `json:"valid_for_ms"`
	ValidUntil       validUntil `json:"valid_until"`
	Seq              uint64     `json:"seq"`
	LastStopReason   *string    `json:"last_stop_reason"`
	LastTerm         *string    `json:"last_term"`
	CollectorHealthy *bool      `json:"collector_healthy"`
}

type state struct {
	mu       sync.RWMutex
	since    time.Time
	deadline time.Time
	seq      uint64
}

func main() {
	addr := "127.0.0.1:0"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	st := &state{since: time.Now(), deadline: time.Now().Add(10 * time.Second)}
	go func() {
		for range time.Tick(2 * time.Second) {
			st.mu.Lock()
			st.deadline = time.Now().Add(10 * time.Second)
			st.seq++
			st.mu.Unlock()
		}
	}()
	identity, term := "go-baseline", "00000000-0000-0000-0000-000000000000/0"
	http.HandleFunc("/leader", func(w http.ResponseWriter, r *http.Request) {
		st.mu.RLock()
		since, deadline, seq := st.since, st.deadline, st.seq
		st.mu.RUnlock()
		left := time.Until(deadline)
		b := body{
			Leading:    left > 0,
			Identity:   identity,
			Holder:     &identity,
			Lease:      leaseRef{Namespace: "collectors", Name: "cluster-metrics", Shard: 0, Shards: 1},
			Term:       &term,
			Since:      since.UTC().Format("2006-01-02T15:04:05.000000Z"),
			ValidForMs: left.Milliseconds(),
			ValidUntil: validUntil{BoottimeMs: deadline.UnixMilli(), Clock: "boottime"},
			Seq:        seq,
		}
		w.Header().Set("Content-Type", "application/json")
		if !b.Leading {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(&b)
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		panic(err)
	}
	// The bench reads the address from the first line.
	os.Stdout.WriteString(ln.Addr().String() + "\n")
	panic(http.Serve(ln, nil))
}
