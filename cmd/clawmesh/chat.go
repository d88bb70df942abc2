package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/clawmesh/clawmesh/internal/rpcclient"
)

const chatUsage = `usage: clawmesh chat [--agent ALIAS] [--session ID] [--token T] [--config-dir DIR] [--socket PATH] [--wait DURATION]

A terminal client: opens (or, with --session, resumes: it must exist) a
session and sends each line you type as a prompt. The agent's text
streams as it arrives, thoughts in parentheses, tool calls and results on
their own lines. Approvals are asked inline: answer o (allow once), a
(always) or r (reject). Ctrl-C cancels the running turn; Ctrl-C at the
prompt, /quit or end of input leaves; a lost connection ends chat with
how to resume. Input that is not a terminal is read line by line the same
way, so chat can be scripted. --wait waits that long for a stack to
listen on the socket (a container started beside its gateway) before
it gives up.
`

// codeSessionNotFound is docs/spec.md's SESSION_NOT_FOUND.
const codeSessionNotFound = -32000

// chatCmd runs `clawmesh chat`.
func chatCmd(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("chat", flag.ContinueOnError)
	var sf socketFlags
	sf.register(fs)
	agent := fs.String("agent", "default", "agent alias of a new session")
	session := fs.String("session", "", "resume this session instead of opening a new one")
	wait := fs.Duration("wait", 0, "wait up to this long for a stack to listen on the socket (0: fail at once)")
	rest, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		usageOf(out, chatUsage, fs)
		return nil
	}
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usageErrorf("chat: unexpected argument %q", rest[0])
	}
	if *wait < 0 {
		return usageErrorf("chat: --wait %s: a duration of 0 or more", *wait)
	}
	c, err := sf.dialWait(map[string]any{"elicitation": map[string]any{}}, *wait)
	if err != nil {
		return err
	}
	defer c.Close()
	c.Timeout = 24 * time.Hour // a turn ends when it ends; Ctrl-C cancels it

	params := map[string]any{"agent_alias": *agent}
	if *session != "" {
		// session/new makes a session under an id that names none: a
		// mistyped --session would open an empty one where the person
		// meant to resume theirs.
		_, err := c.Call("session/state", map[string]any{"session_id": *session})
		var re *rpcclient.RPCError
		if errors.As(err, &re) && re.Code == codeSessionNotFound {
			return fmt.Errorf("chat: --session %s: %s; clawmesh call session/list lists yours, and chat without --session opens a new one", *session, re.Message)
		}
		params["session_id"] = *session
	}
	raw, err := c.Call("session/new", params)
	if err != nil {
		return cliError(err)
	}
	var s struct {
		SessionID    string `json:"session_id"`
		AgentAlias   string `json:"agent_alias"`
		MessageCount int64  `json:"message_count"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return fmt.Errorf("session/new: %w", err)
	}
	agentGiven := false
	fs.Visit(func(f *flag.Flag) { agentGiven = agentGiven || f.Name == "agent" })
	if agentGiven && s.AgentAlias != *agent {
		// A session keeps the agent it was made with: say the flag was
		// not used rather than let the reader think it was.
		fmt.Fprintf(out, "note: --agent %s is not used: session %s runs agent %s\n", *agent, s.SessionID, s.AgentAlias)
	}
	fmt.Fprintf(out, "session %s (agent %s, %d messages); /quit to leave\n", s.SessionID, s.AgentAlias, s.MessageCount)

	ch := &chat{c: c, out: out, lines: bufio.NewScanner(in), session: s.SessionID}
	ch.lines.Buffer(make([]byte, 0, 64<<10), maxInputLine)
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		ch.interactive = true
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	go ch.interrupts(sigs, done)
	return ch.loop()
}

// maxInputLine is the longest line chat reads: one prompt.
const maxInputLine = 1 << 20

// chat is one chat session's state.
type chat struct {
	c           *rpcclient.Client
	out         io.Writer
	lines       *bufio.Scanner
	session     string
	interactive bool

	mu      sync.Mutex
	turning bool // a prompt is in flight
	midLine bool // the last text printed did not end a line
}

func (ch *chat) loop() error {
	for {
		if ch.interactive {
			fmt.Fprint(ch.out, "> ")
		}
		if !ch.lines.Scan() {
			if errors.Is(ch.lines.Err(), bufio.ErrTooLong) {
				return fmt.Errorf("chat: a line of input is longer than 1 MiB, the longest prompt chat sends: %w", ch.lines.Err())
			}
			return ch.lines.Err()
		}
		line := strings.TrimSpace(ch.lines.Text())
		switch line {
		case "":
			continue
		case "/quit", "/exit":
			return nil
		}
		ch.setTurning(true)
		ch.c.OnFrame = ch.frame
		raw, err := ch.c.Call("session/prompt", map[string]any{"session_id": ch.session, "prompt": line})
		ch.setTurning(false)
		ch.endLine()
		if err != nil {
			var re *rpcclient.RPCError
			if !errors.As(err, &re) {
				// Not the daemon's answer: the connection is gone (the
				// gateway restarted, the stack stopped), and every line
				// after this one would fail the same way.
				return fmt.Errorf("chat: the connection to the stack was lost: %w; once it is up, resume with clawmesh chat --session %s", err, ch.session)
			}
			fmt.Fprintf(ch.out, "error: %v\n", cliError(err))
			continue
		}
		var r struct {
			Outcome string `json:"outcome"`
			Content string `json:"content"`
		}
		_ = json.Unmarshal(raw, &r)
		if r.Outcome != "completed" {
			fmt.Fprintf(ch.out, "[turn %s: %s]\n", r.Outcome, r.Content)
		}
	}
}

// frame shows what arrives during a turn and answers approvals.
func (ch *chat) frame(f *rpcclient.Frame, raw []byte) {
	switch {
	case f.Method == "session/update" && len(f.ID) == 0:
		ch.update(f.Params)
	case f.Method == "elicitation/create" && len(f.ID) > 0:
		ch.elicit(f)
	case len(f.ID) > 0:
		// A request chat does not serve: refuse it, as a client must answer.
		line, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": f.ID,
			"error": map[string]any{"code": -32601, "message": "Unknown method: " + f.Method}})
		_ = ch.c.Send(string(line))
	}
}

func (ch *chat) update(params json.RawMessage) {
	var u struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		Name      string          `json:"name"`
		RawInput  json.RawMessage `json:"raw_input"`
		RawOutput string          `json:"raw_output"`
		Status    string          `json:"status"`
		ToolName  string          `json:"tool_name"`
		Summary   string          `json:"arguments_summary"`
		Dropped   int64           `json:"dropped_messages"`
	}
	if json.Unmarshal(params, &u) != nil {
		return
	}
	switch u.Type {
	case "agent_message_chunk":
		ch.print(u.Text)
	case "agent_thought_chunk":
		ch.line("(" + u.Text + ")")
	case "tool_call":
		ch.line(fmt.Sprintf("[tool %s %s]", u.Name, u.RawInput))
	case "tool_result":
		ch.line(fmt.Sprintf("[result %s %s: %s]", u.Name, u.Status, u.RawOutput))
	case "approval_request":
		ch.line(fmt.Sprintf("[approval needed: %s %s]", u.ToolName, u.Summary))
	case "history_trimmed":
		ch.line(fmt.Sprintf("[history trimmed: %d messages]", u.Dropped))
	}
}

// elicit asks the person and answers the daemon's elicitation/create.
func (ch *chat) elicit(f *rpcclient.Frame) {
	var p struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(f.Params, &p)
	ch.line(p.Message)
	result := map[string]any{"action": "decline"}
	for {
		fmt.Fprint(ch.out, "allow once (o), always (a) or reject (r)? ")
		if !ch.lines.Scan() {
			fmt.Fprintln(ch.out)
			break
		}
		choice, ok := map[string]string{"o": "allow_once", "a": "allow_always", "r": "reject"}[strings.ToLower(strings.TrimSpace(ch.lines.Text()))]
		if ok {
			result = map[string]any{"action": "accept", "content": map[string]any{"choice": choice}}
			break
		}
	}
	if err := ch.c.Reply(f.ID, result); err != nil {
		ch.line("error: " + err.Error())
	}
}

// interrupts cancels the running turn on Ctrl-C, or leaves at the prompt.
func (ch *chat) interrupts(sigs <-chan os.Signal, done <-chan struct{}) {
	for {
		select {
		case <-done:
			return
		case <-sigs:
		}
		ch.mu.Lock()
		turning := ch.turning
		ch.mu.Unlock()
		if !turning {
			fmt.Fprintln(ch.out)
			os.Exit(0)
		}
		ch.line("^C: cancelling the turn")
		_ = ch.c.Notify("session/cancel", map[string]any{"session_id": ch.session})
	}
}

func (ch *chat) setTurning(v bool) {
	ch.mu.Lock()
	ch.turning = v
	ch.mu.Unlock()
}

// print writes streamed text as it comes.
func (ch *chat) print(text string) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	fmt.Fprint(ch.out, text)
	ch.midLine = !strings.HasSuffix(text, "\n")
}

// line writes s on a line of its own.
func (ch *chat) line(s string) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.midLine {
		fmt.Fprintln(ch.out)
	}
	fmt.Fprintln(ch.out, s)
	ch.midLine = false
}

func (ch *chat) endLine() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.midLine {
		fmt.Fprintln(ch.out)
		ch.midLine = false
	}
}
