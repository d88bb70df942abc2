-- The durable bridge's own state (seed 004). It never reads the session
-- service's tables: sessions come over gRPC.

-- Every epoch the bridge ever started with, so none is used twice.
CREATE TABLE epochs (
    epoch      text PRIMARY KEY,
    started_at timestamptz NOT NULL DEFAULT now()
);

-- The first answer to each request id of an epoch (status 200 or 409),
-- replayed when the phone sends the id again.
CREATE TABLE request_ids (
    epoch       text NOT NULL,
    request_id  text NOT NULL,
    seq         bigserial,
    fingerprint bytea NOT NULL,
    status      integer NOT NULL,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (epoch, request_id)
);
CREATE INDEX request_ids_epoch_seq ON request_ids (epoch, seq);

-- How each decided ask ended: a late tap gets `decided` with the first
-- outcome, across restarts. At least the last 500 per pane are kept.
CREATE TABLE decided_asks (
    pane_id    text NOT NULL,
    ask_id     text NOT NULL,
    seq        bigserial,
    decided_by text NOT NULL,
    outcome    text NOT NULL,
    decided_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pane_id, ask_id)
);
CREATE INDEX decided_asks_pane_seq ON decided_asks (pane_id, seq);

-- Titles the phone gave workspaces and tabs.
CREATE TABLE titles (
    target text PRIMARY KEY,
    title  text NOT NULL
);

-- Texts the phone sent to a pane while a turn ran: each starts the next
-- turn, in order.
CREATE TABLE queued_sends (
    seq        bigserial PRIMARY KEY,
    pane_id    text NOT NULL,
    body       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queued_sends_pane ON queued_sends (pane_id, seq);
