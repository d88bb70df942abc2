// Command fakeproc stands in for a stack process in the supervisor's
// tests. FAKE_RECORD names a file it appends "<pid> <start unix ns>" to;
// FAKE_SPAM, when set, is a count of bytes it first writes to stderr in
// numbered lines of 100 bytes ("<pid> <n> xxx…"); FAKE_MODE says what it
// does then:
//
//	crash       write FAKE_MESSAGE to stderr and exit FAKE_CODE (default 3)
//	            after FAKE_LIFE
//	serve       serve gRPC health (SERVING) on --listen until SIGTERM
//	notserving  serve health NOT_SERVING, the reason "database: FAKE_MESSAGE"
//	slowstart   write FAKE_MESSAGE to stderr (when set), wait FAKE_LIFE,
//	            then serve
//	steps       answer health at once, NOT_SERVING with the reason
//	            "starting: step N", N from 1 to FAKE_STEPS, each for
//	            FAKE_LIFE, then serve; FAKE_STEPS=-1 never ends, and
//	            FAKE_HANG=N stays at step N for good
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/clawmesh/clawmesh/internal/grpcserver"
)

func main() {
	listen := flag.String("listen", "", "health socket")
	flag.Parse()
	if path := os.Getenv("FAKE_RECORD"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Fprintf(f, "%d %d\n", os.Getpid(), time.Now().UnixNano())
		f.Close()
	}
	if n, err := strconv.Atoi(os.Getenv("FAKE_SPAM")); err == nil {
		for i := 0; i*100 < n; i++ {
			line := fmt.Sprintf("%d %d ", os.Getpid(), i)
			fmt.Fprintln(os.Stderr, line+strings.Repeat("x", 99-len(line)))
		}
	}
	life, _ := time.ParseDuration(os.Getenv("FAKE_LIFE"))
	switch os.Getenv("FAKE_MODE") {
	case "crash":
		time.Sleep(life)
		fmt.Fprintln(os.Stderr, os.Getenv("FAKE_MESSAGE"))
		code := 3
		if c, err := strconv.Atoi(os.Getenv("FAKE_CODE")); err == nil {
			code = c
		}
		os.Exit(code)
	case "slowstart":
		if msg := os.Getenv("FAKE_MESSAGE"); msg != "" {
			fmt.Fprintln(os.Stderr, msg)
		}
		time.Sleep(life)
		serve(*listen, nil)
	case "notserving":
		serve(*listen, errors.New(os.Getenv("FAKE_MESSAGE")))
	case "steps":
		steps(*listen, life)
	default:
		serve(*listen, nil)
	}
}

func serve(listen string, dependency error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	srv := grpcserver.New(zap.NewNop(), time.Second)
	lis, err := grpcserver.Listen(listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	srv.SetDependency("database", dependency)
	srv.SetServing()
	if err := srv.Serve(ctx, lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}

// steps stands in for a long start that says each of its steps.
func steps(listen string, each time.Duration) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	srv := grpcserver.New(zap.NewNop(), time.Second)
	lis, err := grpcserver.Listen(listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	lis = srv.ServeEarly(lis)
	n, _ := strconv.Atoi(os.Getenv("FAKE_STEPS"))
	hang, _ := strconv.Atoi(os.Getenv("FAKE_HANG"))
	for i := 1; n < 0 || i <= n; i++ {
		srv.SetStarting(fmt.Sprintf("step %d", i))
		if i == hang {
			<-ctx.Done()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(each):
		}
	}
	srv.SetServing()
	if err := srv.Serve(ctx, lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
}
