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

// The child half of TestPassedSocket: ask for every name the test gives
// (comma-separated), say whether the variables are left afterwards, and
// answer one connection on the last socket taken with this process's pid.
func TestMain(m *testing.M) {
	if names := os.Getenv("LISTENFD_TEST_CHILD"); names != "" {
		var last net.Listener
		for _, name := range strings.Split(names, ",") {
			ln, err := Listener(name)
			if err != nil {
				fmt.Println("error:", err)
				os.Exit(0)
			}
			if ln != nil {
				last = ln
			}
		}
		vars := "gone"
		if os.Getenv(envFDs) != "" {
			vars = "kept"
		}
		if last == nil {
			fmt.Println("none, variables " + vars)
			os.Exit(0)
		}
		fmt.Println("listening on " + filepath.Base(last.Addr().String()) + ", variables " + vars)
		c, err := last.Accept()
		if err == nil {
			fmt.Fprintf(c, "%d\n", os.Getpid())
			c.Close()
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Sockets the parent keeps listening on are served by the child they are
// passed to, each under its own name and descriptor, also after the
// child asked for a name that was not passed. The variables stay while a
// passed socket is left to take (a gateway takes its client socket, then
// its gRPC socket) and go once all are taken; a child asking for another
// name takes nothing and keeps them; one told the descriptors are
// another process's (LISTEN_PID) takes nothing and drops them.
func TestPassedSocket(t *testing.T) {
	dir := t.TempDir()
	var files []*os.File
	for _, name := range []string{"other.sock", "client.sock"} {
		ln, err := net.Listen("unix", filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		f, err := ln.(*net.UnixListener).File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	child := func(want string, extra ...string) (*exec.Cmd, *bufio.Reader) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append([]string{"LISTENFD_TEST_CHILD=" + want}, extra...)...)
		Pass(cmd, []string{"other", ClientSocket}, files)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, bufio.NewReader(out)
	}

	for _, tc := range []struct{ names, said, sock string }{
		{ClientSocket, "listening on client.sock, variables kept\n", "client.sock"},
		{"other," + ClientSocket, "listening on client.sock, variables gone\n", "client.sock"},
		{ClientSocket + ",other", "listening on other.sock, variables gone\n", "other.sock"},
		{GRPCSocket + ",other," + ClientSocket, "listening on client.sock, variables gone\n", "client.sock"},
	} {
		cmd, out := child(tc.names)
		if line, _ := out.ReadString('\n'); line != tc.said {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s: child said %q, want %q", tc.names, line, tc.said)
		}
		c, err := net.DialTimeout("unix", filepath.Join(dir, tc.sock), 5*time.Second)
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
			t.Fatalf("%s: served by %q, want the child %d", tc.names, pid, cmd.Process.Pid)
		}
	}

	for _, tc := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"unknown", nil, "none, variables kept\n"},
		{ClientSocket, []string{envPID + "=1"}, "none, variables gone\n"},
	} {
		cmd, out := child(tc.name, tc.extra...)
		line, _ := out.ReadString('\n')
		cmd.Wait()
		if line != tc.want {
			t.Errorf("%s %v: child said %q, want %q", tc.name, tc.extra, line, tc.want)
		}
	}
}
