-- When a waker on the host (`loopx run`, or the tmux waker the hooks start)
-- last said it types queued messages into the session's idle agent; null:
-- none does. The projection's `agent.delivery` is read from it.
alter table sessions add column waker_heard_at integer;
