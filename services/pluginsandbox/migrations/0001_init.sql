-- Installed plugins as discovered and verified; the wasm itself stays on
-- disk in the plugins folder.
CREATE TABLE installed_plugins (
    plugin_key   text PRIMARY KEY,
    version      text NOT NULL,
    manifest     jsonb NOT NULL,
    signed_by    text,
    installed_at timestamptz NOT NULL DEFAULT now()
);
