package pluginsandbox_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/pluginpkg/install"
	"github.com/clawmesh/clawmesh/internal/pluginpkg/manifest"
	pluginv1 "github.com/clawmesh/clawmesh/proto/clawmesh/plugin/v1"
	"github.com/clawmesh/clawmesh/services/pluginsandbox"
)

// A call that looked its tool up just before an upgrade's scan, while
// another call of the plugin runs, runs on the new load. Before, its
// call reference waited behind the old load's unload (which waits for
// the running call) and then failed as NotFound "Unknown tool
// `misbehave`", though the upgraded plugin was loaded. The running call
// finishes on the old load either way.
func TestCallRacingAnUpgradeRunsOnTheNewLoad(t *testing.T) {
	dir := t.TempDir()
	src := t.TempDir()
	installExample(t, src, "misbehave")
	in := &install.Installer{PluginsDir: dir, Policy: manifest.DefaultPolicy()}
	if _, err := in.InstallPath(context.Background(), filepath.Join(src, "misbehave")); err != nil {
		t.Fatal(err)
	}
	ts := newTestServer(t, dir)

	atHook, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	undo := pluginsandbox.SetToolLookupHook(func(string) {
		once.Do(func() {
			close(atHook)
			<-resume
		})
	})
	defer undo()
	type result struct {
		resp *pluginv1.ExecuteToolResponse
		err  error
	}
	call := func(args string) chan result {
		ch := make(chan result, 1)
		go func() {
			resp, err := ts.ExecuteTool(context.Background(), &pluginv1.ExecuteToolRequest{ToolName: "misbehave", ArgumentsJson: args})
			ch <- result{resp, err}
		}()
		return ch
	}
	racing := call(`{"mode":"calls"}`)
	<-atHook // it holds the old load's entry, no reference yet
	running := call(`{"mode":"sleep","ms":3000}`)
	// Give the running call time to start on the old load (were it late,
	// it would find the new one: the test still holds).
	time.Sleep(300 * time.Millisecond)
	rewriteManifest(t, src, "misbehave", func(s string) string { return strings.Replace(s, `version = "0.1.0"`, `version = "0.2.0"`, 1) })
	if _, err := in.InstallPath(context.Background(), filepath.Join(src, "misbehave")); err != nil {
		t.Fatal(err)
	}
	ts.rescan(t)
	if p := ts.plugins(t)["misbehave"]; p.GetVersion() != "0.2.0" || p.GetStatus() != "loaded" {
		t.Fatalf("after the upgrade: %+v", p)
	}
	// The old load's unload is now waiting for the running call.
	time.Sleep(300 * time.Millisecond)
	close(resume)
	if got := <-racing; got.err != nil || !got.resp.GetSuccess() {
		t.Fatalf("a call racing the upgrade: %+v %v", got.resp, got.err)
	}
	if got := <-running; got.err != nil || got.resp.GetOutput() != "slept" {
		t.Fatalf("the call running across the upgrade: %+v %v", got.resp, got.err)
	}
}
