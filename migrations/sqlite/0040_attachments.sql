-- Attachments (issue 39): files a person sends with a message.

-- a file's bytes, once however many turns name it: keyed by the sha256 of
-- the bytes (lowercase hex). In the database, not on a disk, so a backup or
-- a replica holds them with the turns. `sniffed_type` is the image type read
-- from the magic bytes (png, jpeg, gif, webp), null for anything else.
-- `created_at` is touched by every upload that names the blob again, so that
-- retention, which deletes a blob no attachment names, never takes one an
-- upload in flight is about to name.
create table attachment_blobs (
    sha256       text primary key,
    size         integer not null,
    sniffed_type text,
    bytes        blob not null,
    created_at   integer not null
) without rowid;
create index attachment_blobs_created on attachment_blobs (created_at);

-- a turn's files, in the order sent (`position` 0, 1, …). Written in the
-- enqueue's own transaction, with the turn. `name` is sanitized (a plain
-- file name); `declared_type` is what the sender said, `content_type` what
-- the broker serves it as. No foreign key to the blob: a download of a blob
-- that is gone answers 404.
create table turn_attachments (
    turn_id       text not null,
    position      integer not null,
    session_id    text not null,
    name          text not null,
    declared_type text not null,
    content_type  text not null,
    size          integer not null,
    sha256        text not null,
    primary key (turn_id, position)
) without rowid;
-- the session's total (its limit) and retention's deletes.
create index turn_attachments_session on turn_attachments (session_id);
-- retention's "no attachment names this blob".
create index turn_attachments_sha256 on turn_attachments (sha256);

-- the turn's attachments as JSON (what the claim and the readback list;
-- null: none), so a turn's decisions and answers need no second read.
alter table turns add column attachments text;
