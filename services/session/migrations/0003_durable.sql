-- Durable sessions (issue 12): the retained provider context and the
-- checkpoints of a running turn, kept apart from the visible transcript.
-- Every durable row names the interaction surface of the turn that wrote
-- it: recovery only considers the surfaces it knows.

ALTER TABLE messages
    ADD COLUMN interaction_surface text NOT NULL DEFAULT 'rpc';

ALTER TABLE turns
    ADD COLUMN interaction_surface text NOT NULL DEFAULT 'rpc';

-- Rows written before this migration take their session's surface.
UPDATE messages m SET interaction_surface = s.interaction_surface
    FROM sessions s WHERE s.session_id = m.session_id AND s.interaction_surface <> 'rpc';
UPDATE turns t SET interaction_surface = s.interaction_surface
    FROM sessions s WHERE s.session_id = t.session_id AND s.interaction_surface <> 'rpc';
-- turns.state: running, then done; or interrupted when the process that
-- ran it died and its surface is not one recovery restores (its
-- checkpoint is left as it was, for that surface to inspect).

-- checkpoint_events is the log a turn writes as it runs, in batches: what
-- the client saw (message text, thoughts, tool calls and results) and
-- what the provider is given (the prompt, the text, tool calls and
-- results). seq is dense per session and orders the log; the retained
-- context is the latest snapshot plus the provider events after its
-- boundary.
CREATE TABLE checkpoint_events (
    session_id          text    NOT NULL REFERENCES sessions ON DELETE CASCADE,
    seq                 bigint  NOT NULL,
    turn_id             text    NOT NULL,
    -- step is the provider step of the turn: the text and tool calls of
    -- one step are one assistant message.
    step                integer NOT NULL DEFAULT 0,
    -- kind: user, text, thought, tool_call, tool_result.
    kind                text    NOT NULL,
    interaction_surface text    NOT NULL,
    content             text    NOT NULL DEFAULT '',
    -- call_id is the provider's id of a tool call, tool_call_id ours.
    call_id             text    NOT NULL DEFAULT '',
    tool_call_id        text    NOT NULL DEFAULT '',
    name                text    NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, seq)
);

CREATE INDEX checkpoint_events_turn ON checkpoint_events (turn_id, seq);

-- context_snapshots holds a session's latest retained context: the
-- messages the provider is given for every event up to boundary. A
-- session without one (created before this migration) replays its
-- transcript instead; an empty one is authoritative.
CREATE TABLE context_snapshots (
    session_id          text   PRIMARY KEY REFERENCES sessions ON DELETE CASCADE,
    boundary            bigint NOT NULL,
    messages            jsonb  NOT NULL,
    interaction_surface text   NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);
