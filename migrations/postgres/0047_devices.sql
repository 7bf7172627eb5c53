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

-- Web Push subscriptions (WEB.md "Installable, and it tells you"), each the
-- owner's (`device_id` null) or a device's, gone with the device. One row
-- per endpoint: a browser subscribing again replaces its keys.
create table push_subscriptions (
    subscription_id text primary key,
    device_id       text,
    endpoint        text not null unique,
    p256dh          text not null,
    auth            text not null,
    created_at      bigint not null
);
create index push_subscriptions_device on push_subscriptions (device_id);
