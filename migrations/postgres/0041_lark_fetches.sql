-- Lark's durable download jobs (issue 39): a Lark message's files are
-- fetched after its event is committed and acknowledged. The turn is
-- written with the event and keeps its place in the queue; while its job
-- row exists, no claim takes it (nor any turn behind it). The job is
-- deleted in the transaction that stores the files on the turn, so a
-- restart mid-download finds the row and fetches again: files are
-- content-addressed, stored once however often they are fetched.
-- `resources` is the JSON list of what the message names (key, kind,
-- name), in order; `failures` paces the retry backoff (a rate-limit wait
-- is not a failure).
create table lark_fetches (
    turn_id         text primary key,
    session_id      text not null,
    message_id      text not null,
    resources       text not null,
    failures        bigint not null default 0,
    next_attempt_at bigint not null,
    created_at      bigint not null
);
create index lark_fetches_due on lark_fetches (next_attempt_at);
create index lark_fetches_session on lark_fetches (session_id);
