-- When the host that made a permission request relayed its answer to the
-- agent (null until then). A bridge that restarts relays the answers that are
-- committed and not relayed, so an answer given while it was away still
-- reaches the agent, and nothing is relayed twice.
alter table permission_requests add column relayed_at integer;
