-- Retention (--retain-closed-days, loopx prune) finds the oldest closed
-- sessions and removes a session's claims and Lark replies, and old Lark
-- redelivery guards, through these indexes instead of scanning whole tables.
create index sessions_closed on sessions (closed_at) where state = 'closed';
create index claims_session on claims (session_id);
create index lark_replies_session on lark_replies (session_id);
create index lark_events_received on lark_events (received_at);

-- /metrics sums the queued turns over the sessions that have any, and reads
-- each one's head of queue, without scanning every session.
create index sessions_queued on sessions (session_id) where queued_count > 0;
