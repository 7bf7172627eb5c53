-- Devices signed in with a one-time link (issue 56, WEB.md "Signing in a
-- phone"): the owner mints a link (`device_links`: only its code's SHA-256
-- is kept, good once until `expires_at`), a phone trades its code for a
-- device credential of its own (`devices`: only the credential's SHA-256,
-- looked up on every request the device makes, hence unique). Revoking a
-- device deletes its row: its next request finds nothing, 401.
create table device_links (
    code_hash  text primary key,
    created_at bigint not null,
    expires_at bigint not null,
    used_at    bigint
);

create table devices (
    device_id    text primary key,
    name         text not null,
    token_hash   text not null unique,
    created_at   bigint not null,
    last_seen_at bigint
);
