-- output_bytes is the size of a tool call's whole output, which its live
-- tool_result said; raw_output keeps at most 16 KiB of it. NULL for a
-- call finished before this migration (its kept output's size is all
-- that is known). Resend sends it again with the call's result.
ALTER TABLE tool_calls ADD COLUMN output_bytes bigint;
