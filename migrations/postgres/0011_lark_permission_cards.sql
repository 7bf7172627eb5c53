-- A permission request's message is an interactive card with Allow / Deny
-- buttons, and it follows the request: once the request is settled
-- (answered anywhere, withdrawn, expired with its session) the card is
-- updated in place to its final form, once. `message_id` is the card's Lark
-- message (known once it was sent; the update PATCHes it). `update_state`:
-- `pending` until the card shows its final form, `sent` once it does (by the
-- PATCH, or by the answer to a click, which replaces the card itself),
-- `failed` when Lark refused the PATCH for good (too old, recalled, deleted).
-- A row is due for its update when its request is no longer pending: that
-- is read from `permission_requests`, so settling a request writes nothing
-- here. `answered_by` is the approver (Lark open id) whose click or
-- `yes <id>` answered, shown on the final card.
alter table lark_permission_messages add column message_id text;
alter table lark_permission_messages add column answered_by text;
alter table lark_permission_messages add column update_state text not null default 'pending'
    check (update_state in ('pending', 'sent', 'failed'));
alter table lark_permission_messages add column update_attempts bigint not null default 0;
-- failed attempts, apart from waits Lark asked for (as for replies).
alter table lark_permission_messages add column update_failures bigint not null default 0;
alter table lark_permission_messages add column update_error text;
alter table lark_permission_messages add column update_next_at bigint not null default 0;
create index lark_permission_messages_update_due on lark_permission_messages (update_next_at)
    where update_state = 'pending' and message_id is not null;
