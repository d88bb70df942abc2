CREATE TABLE sessions (
    session_id          text PRIMARY KEY,
    agent_alias         text NOT NULL,
    owner               text NOT NULL,
    state               text NOT NULL DEFAULT 'idle',
    generation          bigint NOT NULL DEFAULT 1,
    interaction_surface text NOT NULL DEFAULT 'rpc',
    workspace_dir       text NOT NULL,
    title               text NOT NULL DEFAULT '',
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- The visible transcript: rows are appended and never renumbered.
CREATE TABLE messages (
    session_id text NOT NULL REFERENCES sessions ON DELETE CASCADE,
    idx        bigint NOT NULL,
    role       text NOT NULL,
    content    text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, idx)
);

CREATE TABLE tool_calls (
    session_id   text NOT NULL REFERENCES sessions ON DELETE CASCADE,
    tool_call_id text NOT NULL,
    turn_id      text NOT NULL,
    name         text NOT NULL,
    raw_input    jsonb NOT NULL,
    raw_output   text,
    status       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (session_id, tool_call_id)
);
