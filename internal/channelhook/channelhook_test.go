package channelhook_test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/channelhook"
	"github.com/clawmesh/clawmesh/internal/testwait"
)

func post(t *testing.T, url, body, auth string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// The held paths keep one message and give it back at every ask; a
// reply is handed over with its header and answered 204.
func TestHeldMessageKeptAndRepliesHandedOver(t *testing.T) {
	var got []channelhook.Reply
	url := channelhook.Serve(t, func(r channelhook.Reply) { got = append(got, r) })
	if resp := post(t, url+"/held", "", ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("held with nothing kept: %s, want 204", resp.Status)
	}
	if resp := post(t, url+"/hold", `{"id":"held-1"}`, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("hold: %s", resp.Status)
	}
	for range 2 {
		resp := post(t, url+"/held", "", "")
		if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusOK || string(b) != `{"id":"held-1"}` {
			t.Fatalf("held: %s %q, want the kept message", resp.Status, b)
		}
	}
	if resp := post(t, url, `{"content":"hi","thread_id":"t-1"}`, "Bearer x"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("reply: %s", resp.Status)
	}
	if len(got) != 1 || got[0].Body["content"] != "hi" || got[0].Body["thread_id"] != "t-1" || got[0].Auth != "Bearer x" {
		t.Fatalf("replies %+v, want the one reply with its header (the held paths are no replies)", got)
	}
}

func TestChanAndContents(t *testing.T) {
	url, replies := channelhook.Chan(t, 1)
	post(t, url, `{"content":"a"}`, "")
	if r := testwait.Recv(t, replies); r["content"] != "a" {
		t.Fatalf("chan: %v", r)
	}
	url, contents := channelhook.Contents(t)
	post(t, url, `{"content":"a"}`, "")
	post(t, url, `{"content":"b"}`, "")
	if got := contents(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("contents %q, want a then b", got)
	}
}
