-- Failed send attempts of a reply, apart from waits Lark asked for (rate
-- limits): the give-up budget counts these, while `attempts` counts every send.
alter table lark_replies add column failures bigint not null default 0;
