package jsonrpc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
)

// SendAll writes its frames in order and together: frames another
// goroutine sends at the same time never come between them, whether the
// batch is written directly or queued for the writer (net.Pipe blocks
// every write until it is read, so both paths are taken).
func TestSendAllKeepsBatchesWholeAndInOrder(t *testing.T) {
	server, client := net.Pipe()
	defer client.Close()
	c := NewConn(server, nil, Options{InitializeTimeout: -1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan struct{})
	go func() { defer close(ran); _ = c.Run(ctx) }()
	defer func() { c.Close(); <-ran }()

	const batches, size, singles = 200, 5, 500
	encode := func(method string, params ...int) Notification {
		raw, _ := json.Marshal(params)
		n, err := EncodeNotification(method, json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var senders sync.WaitGroup
	senders.Add(2)
	go func() {
		defer senders.Done()
		for k := range batches {
			ns := make([]Notification, size)
			for j := range ns {
				ns[j] = encode("a", k, j)
			}
			if err := c.SendAll(ctx, ns); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	go func() {
		defer senders.Done()
		for k := range singles {
			if err := c.SendAll(ctx, []Notification{encode("b", k)}); err != nil {
				t.Error(err)
				return
			}
		}
	}()

	r := bufio.NewReader(client)
	nextA, nextB := 0, 0 // frames of each kind seen
	for nextA < batches*size || nextB < singles {
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("after %d a and %d b frames: %v", nextA, nextB, err)
		}
		var f struct {
			Method string `json:"method"`
			Params []int  `json:"params"`
		}
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatalf("frame %q: %v", line, err)
		}
		switch f.Method {
		case "a":
			if want := []int{nextA / size, nextA % size}; fmt.Sprint(f.Params) != fmt.Sprint(want) {
				t.Fatalf("a frame %v, want %v", f.Params, want)
			}
			nextA++
		case "b":
			if nextA%size != 0 {
				t.Fatalf("b frame %v inside batch %d", f.Params, nextA/size)
			}
			if f.Params[0] != nextB {
				t.Fatalf("b frame %v, want %d", f.Params, nextB)
			}
			nextB++
		default:
			t.Fatalf("frame %q", line)
		}
	}
	senders.Wait()
	if err := c.SendAll(ctx, nil); err != nil {
		t.Fatalf("empty batch: %v", err)
	}
	if err := c.SendAll(ctx, []Notification{{}}); err == nil {
		t.Fatal("an empty notification was sent")
	}
}
