//go:build wasip1

// Command webhook is an example channel plugin. Outbound messages are
// POSTed as JSON to the configured webhook_url with the secret token as a
// bearer credential; inbound messages come from the host, which runs the
// listener and queues what it receives ({"id","from","text","thread"}).
// It keeps no config, secret or message state between calls: everything is
// resolved at the point of use, so the host may rebuild it at any time.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/clawmesh/clawmesh/plugins/pdk"
	"github.com/clawmesh/clawmesh/plugins/pdk/channel"
)

type webhook struct{ channel.NoTyping }

type settings struct {
	WebhookURL string `json:"webhook_url"`
}

// load resolves the public config; call it where it is used.
func load() (settings, error) {
	var s settings
	raw, err := pdk.Config()
	if err != nil {
		return s, fmt.Errorf("config: %w", err)
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return s, fmt.Errorf("config: %w", err)
	}
	if s.WebhookURL == "" {
		return s, errors.New("webhook_url is not configured")
	}
	return s, nil
}

func (webhook) Name() string { return "webhook" }

func (webhook) Capabilities() channel.Capabilities { return channel.Capabilities{Health: true} }

// Configure checks that the config and the token resolve.
func (webhook) Configure() error {
	if _, err := load(); err != nil {
		return err
	}
	if _, err := pdk.Secret("token"); err != nil {
		return fmt.Errorf("token: %w", err)
	}
	pdk.Log(pdk.LevelInfo, pdk.Event{Action: "configure", Outcome: "success", Message: "webhook channel configured"})
	return nil
}

func (webhook) Send(msg channel.SendMessage) error {
	s, err := load()
	if err != nil {
		return err
	}
	token, err := pdk.Secret("token")
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	body, _ := json.Marshal(msg)
	resp, err := pdk.Fetch(pdk.HTTPRequest{
		Method: "POST", URL: s.WebhookURL, Body: body,
		Headers: map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + token},
	})
	if err != nil {
		pdk.Log(pdk.LevelWarn, pdk.Event{Action: "send", Outcome: "failure", Message: err.Error()})
		return fmt.Errorf("post: %w", err)
	}
	if resp.Status/100 != 2 {
		return fmt.Errorf("webhook answered %d", resp.Status)
	}
	return nil
}

// PollMessage turns the next host-queued message into a channel message.
func (webhook) PollMessage() (*channel.Message, error) {
	if channel.Pending() == 0 {
		return nil, nil
	}
	raw, ok := channel.Poll()
	if !ok {
		return nil, nil
	}
	var in struct {
		ID     string `json:"id"`
		From   string `json:"from"`
		Text   string `json:"text"`
		Thread string `json:"thread"`
	}
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fmt.Errorf("inbound message: %w", err)
	}
	return &channel.Message{ID: in.ID, Sender: in.From, ReplyTarget: in.From, Content: in.Text, ThreadID: in.Thread}, nil
}

// PollRefused hears of a message the host refused for its size (its
// text, which encoding/json decodes invalid UTF-8 in at three bytes a
// byte, past the alias's max_content_kb). The webhook took the message
// from the host's queue when it polled it and keeps nothing: it drops it
// by keeping nothing, and goes on with the next. Its sender was told by
// the host; the record says what became of it in the plugin's own log.
func (webhook) PollRefused(r channel.Refusal) error {
	pdk.Log(pdk.LevelWarn, pdk.Event{Action: "poll", Outcome: "denied",
		Message: "message refused by the host; dropped",
		Fields:  map[string]string{"id": r.ID, "field": r.Field, "bytes": strconv.Itoa(r.Bytes), "bound": strconv.Itoa(r.Bound)}})
	return nil
}

// Health is true when the channel's config resolves.
func (webhook) Health() bool {
	_, err := load()
	return err == nil
}

func init() { channel.Register(webhook{}) }

func main() {}
