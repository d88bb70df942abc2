package e2e_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/e2e"
	"github.com/clawmesh/clawmesh/internal/guestbuild"
)

// A channel whose plugin's own service holds a message the host refused
// for its size, in a running stack: the binding fails (plugins/list says
// why), its listener answers new posts 503 with Retry-After, the
// refused message's sender is told once, and once the plugin is
// replaced by one that moves on, what was accepted behind it is
// delivered, in order.
func TestPluginChannelStalledOnAHeldMessage(t *testing.T) {
	t.Parallel()
	dataDir := e2e.TempDataDir(t)
	installPlugin(t, dataDir, "webhook")
	src, err := channelhook.HeldWebhookSource()
	if err != nil {
		t.Fatal(err)
	}
	held, err := guestbuild.WasmWith("webhook", "testhooks.go", src)
	if err != nil {
		t.Fatal(err)
	}
	replacePluginWasm(t, dataDir, held)
	if err := e2e.SeedCompiled(dataDir, held); err != nil {
		t.Fatal(err)
	}
	s := e2e.Start(t, e2e.Options{DataDir: dataDir, Args: []string{
		"--set", "plugins.scan_interval_ms=200", "--set", "plugins.http.allowed_networks=127.0.0.0/8"}})
	v := newConv(t, s, nil)
	hookURL, replies := channelhook.Contents(t)
	bindWebChannel(t, v, hookURL)
	listen := webChannelListen(t, v, "")

	post := func(body string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/", bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer "+webChannelToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(text))
		return resp
	}
	// 360 KiB of invalid bytes, which the webhook decodes at three bytes
	// each: past the 1 MiB a polled message's content may be.
	bad := `{"id":"held-1","from":"ann","thread":"t-1","text":"` + strings.Repeat("\xff", 360<<10) + `"}`
	for _, body := range []string{bad,
		`{"id":"m2","from":"ann","thread":"t-1","text":"/say first"}`,
		`{"id":"m3","from":"ann","thread":"t-1","text":"/say second"}`} {
		if resp := post(body); resp.StatusCode != http.StatusAccepted {
			t.Fatalf("a post before the stall: %s", resp.Status)
		}
	}
	var reason string
	waitFor(t, "the binding failed on the held message", 3*time.Minute, func() bool {
		for _, ch := range listPlugins(t, v).Channels {
			if ch.Alias == "web" && ch.State == "failed" {
				reason = ch.Reason
				return true
			}
		}
		return false
	})
	if !strings.Contains(reason, "own service holds it") {
		t.Errorf("the failed binding's reason: %q", reason)
	}
	resp := post(`{"id":"m4","from":"ann","thread":"t-1","text":"/say refused"}`)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "60" || !strings.Contains(string(body), "refused for its size") {
		t.Errorf("a post to the failed channel: %s, Retry-After %q, %q", resp.Status, resp.Header.Get("Retry-After"), body)
	}
	if got := replies(); len(got) != 1 || !strings.Contains(got[0], "not delivered") {
		t.Errorf("replies while failed: %q, want the refused message's sender told once", got)
	}

	// Replaced by the webhook example, which moves on.
	plain, err := guestbuild.Wasm("webhook")
	if err != nil {
		t.Fatal(err)
	}
	replacePluginWasm(t, dataDir, plain)
	waitFor(t, "the messages accepted behind the held one", 3*time.Minute, func() bool { return len(replies()) >= 3 })
	if got := replies(); !slices.Equal(got[1:], []string{"first", "second"}) {
		t.Errorf("replies after the replacement: %q, want the told one, then first and second in order", got)
	}
}

// replacePluginWasm writes wasm's file over dataDir's webhook plugin.
func replacePluginWasm(t *testing.T, dataDir, wasm string) {
	t.Helper()
	raw, err := os.ReadFile(wasm)
	if err == nil {
		err = os.WriteFile(filepath.Join(dataDir, "plugins", "webhook", "plugin.wasm"), raw, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}
