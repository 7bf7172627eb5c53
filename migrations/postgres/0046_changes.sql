-- What the agent changed (issue 57): the latest report of a session's
-- working tree (its branch, files and unified diff, as JSON in `body`),
-- one row per session replaced by each report; and per turn, the files
-- that turn's tools wrote with their counts (`files`, JSON). Both are
-- content, kept like message text (bytes: any UTF-8), and pruned with
-- their session. No foreign keys: retention removes a session's rows
-- itself, children first.
create table session_changes (
    session_id  text primary key,
    body        bytea not null,
    reported_at bigint not null
);
create table turn_changes (
    turn_id    text primary key,
    session_id text not null,
    files      bytea not null,
    updated_at bigint not null
);
-- A read shows a session's latest turns; retention finds a session's rows.
create index turn_changes_session on turn_changes (session_id, updated_at);
