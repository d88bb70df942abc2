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

// The child half of TestPassedSocket: take the socket named by the test
// and answer one connection with this process's pid.
func TestMain(m *testing.M) {
	if name := os.Getenv("LISTENFD_TEST_CHILD"); name != "" {
		ln, err := Listener(name)
		switch {
		case err != nil:
			fmt.Println("error:", err)
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
// passed to; a child asking for another name, or told the descriptors are
// another process's (LISTEN_PID), takes nothing.
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

	cmd, out := child(ClientSocket)
	if line, _ := out.ReadString('\n'); line != "listening\n" {
		t.Fatalf("child said %q", line)
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
		t.Fatalf("served by %q, want the child %d", pid, cmd.Process.Pid)
	}

	for _, tc := range []struct {
		name  string
		extra []string
	}{{"unknown", nil}, {ClientSocket, []string{envPID + "=1"}}} {
		cmd, out := child(tc.name, tc.extra...)
		line, _ := out.ReadString('\n')
		cmd.Wait()
		if line != "none\n" {
			t.Errorf("%s %v: child said %q", tc.name, tc.extra, line)
		}
	}
}
