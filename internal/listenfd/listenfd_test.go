package listenfd

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The child half of TestPassedSocket: ask for each name the test gives
// (comma-separated) until one is passed, take that socket and answer one
// connection with this process's pid.
func TestMain(m *testing.M) {
	if names := os.Getenv("LISTENFD_TEST_CHILD"); names != "" {
		var ln net.Listener
		var err error
		for _, name := range strings.Split(names, ",") {
			if ln, err = Listener(name); ln != nil || err != nil {
				break
			}
		}
		switch {
		case err != nil:
			fmt.Println("error:", err)
		case ln == nil && os.Getenv(envFDs) != "":
			fmt.Println("none, variables kept")
		case ln == nil:
			fmt.Println("none")
		default:
			if os.Getenv(envFDs) != "" {
				fmt.Println("variables left for a child")
				os.Exit(0)
			}
			fmt.Println("listening")
			c, err := ln.Accept()
			if err == nil {
				fmt.Fprintf(c, "%d\n", os.Getpid())
				c.Close()
			}
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// A socket the parent keeps listening on is served by the child it is
// passed to, also after the child asked for a name that was not passed;
// a child asking for another name takes nothing and keeps the variables
// for its next lookup; one told the descriptors are another process's
// (LISTEN_PID) takes nothing and drops them.
func TestPassedSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	f, err := ln.(*net.UnixListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	child := func(want string, extra ...string) (*exec.Cmd, *bufio.Reader) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append([]string{"LISTENFD_TEST_CHILD=" + want}, extra...)...)
		Pass(cmd, []string{"other", ClientSocket}, []*os.File{f, f})
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewReader(out)
	}

	for _, names := range []string{ClientSocket, GRPCSocket + "," + ClientSocket} {
		cmd, out := child(names)
		if line, _ := out.ReadString('\n'); line != "listening\n" {
			t.Fatalf("%s: child said %q", names, line)
		}
		c, err := net.DialTimeout("unix", path, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		pid, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(pid) != strconv.Itoa(cmd.Process.Pid) {
			t.Fatalf("%s: served by %q, want the child %d", names, pid, cmd.Process.Pid)
		}
	}

	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"unknown", nil, "none, variables kept\n"},
		{ClientSocket, []string{envPID + "=1"}, "none\n"},
	} {
		cmd, out := child(tc.name, tc.extra...)
		line, _ := out.ReadString('\n')
		cmd.Wait()
		if line != tc.want {
			t.Errorf("%s %v: child said %q, want %q", tc.name, tc.extra, line, tc.want)
		}
	}
}
