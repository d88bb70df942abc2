//go:build wasip1

package main

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/channel"
	"github.com/clawmesh/clawmesh/plugins/pdk/memory"
)

// The same module also exports the channel and memory worlds, so that one
// test guest covers every adapter. A message or entry whose content is
// "panic" panics, "loop" spins forever; the rest behaves.

// misbehaveChannel keeps instance state (configure and send counts) that a
// rebuild visibly resets; PollMessage reports it in ThreadID.
type misbehaveChannel struct{}

var (
	configured, sent int
	typingFor        string
)

func (misbehaveChannel) Name() string { return "misbehave" }
func (misbehaveChannel) Capabilities() channel.Capabilities {
	return channel.Capabilities{Health: true, Typing: true}
}

func (misbehaveChannel) Configure() error {
	configured++
	return nil
}

func (misbehaveChannel) Send(msg channel.SendMessage) error {
	switch msg.Content {
	case "panic":
		panic("misbehave: asked to panic")
	case "loop":
		spinForever()
	case "fail":
		return errors.New("asked to fail")
	}
	sent++
	return nil
}

func (misbehaveChannel) PollMessage() (*channel.Message, error) {
	pending := channel.Pending()
	raw, ok := channel.Poll()
	if !ok {
		return nil, nil
	}
	return &channel.Message{
		ID: fmt.Sprint(pending), Sender: "host", Content: string(raw),
		ThreadID: fmt.Sprintf("configured=%d sent=%d", configured, sent),
	}, nil
}

func (misbehaveChannel) Health() bool { return configured > 0 }

func (misbehaveChannel) StartTyping(recipient string) error {
	typingFor = recipient
	return nil
}

func (misbehaveChannel) StopTyping(recipient string) error {
	if typingFor != recipient {
		return errors.New("not typing for " + recipient)
	}
	typingFor = ""
	return nil
}

// misbehaveMemory is an in-instance key-value store. Content "fetch:URL",
// "secret" and "config" try the host imports the memory world does not
// have, and fail with what the host answered.
type misbehaveMemory struct{}

var kv = map[string]memory.Entry{}

func (misbehaveMemory) Name() string                      { return "misbehave" }
func (misbehaveMemory) Capabilities() memory.Capabilities { return memory.Capabilities{Count: true} }

func (misbehaveMemory) Store(e memory.Entry) error {
	switch {
	case e.Content == "panic":
		panic("misbehave: asked to panic")
	case e.Content == "loop":
		spinForever()
	case strings.HasPrefix(e.Content, "fetch:"):
		if _, err := pdk.Fetch(pdk.HTTPRequest{Method: "GET", URL: strings.TrimPrefix(e.Content, "fetch:")}); err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		return errors.New("fetch: reached the network")
	case e.Content == "secret":
		_, err := pdk.Secret("api_key")
		return fmt.Errorf("secret: %v", err)
	case e.Content == "config":
		_, err := pdk.Config()
		return fmt.Errorf("config: %v", err)
	}
	kv[e.Key] = e
	return nil
}

func (misbehaveMemory) Recall(query string, limit int) ([]memory.Entry, error) {
	var out []memory.Entry
	for _, e := range kv {
		if strings.Contains(e.Content, query) {
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (misbehaveMemory) Forget(key string) (bool, error) {
	_, ok := kv[key]
	delete(kv, key)
	return ok, nil
}

func (misbehaveMemory) Count() (int, error) { return len(kv), nil }

//go:noinline
func spinForever() {
	x := 0
	for {
		x++
		if x == -1 {
			return
		}
	}
}

func init() {
	channel.Register(misbehaveChannel{})
	memory.Register(misbehaveMemory{})
}
