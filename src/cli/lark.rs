//! `loopx lark …`: which Lark chat feeds which session.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::common::{ClientOptions, with_client};

/// The Lark connector: which Lark chat feeds which session.
#[derive(Debug, Args)]
pub struct LarkArgs {
    #[command(subcommand)]
    pub command: LarkCommand,
}

#[derive(Debug, Subcommand)]
pub enum LarkCommand {
    /// Link a Lark chat to an open session: its messages join the session's queue.
    #[command(
        after_help = "Example:\n  loopx lark link --session-id ses_01JD... --chat-id oc_5ce6d572455d361153b7xx51da133945"
    )]
    Link(LarkLinkArgs),
    /// Unlink the session's Lark chat: its messages are no longer enqueued.
    #[command(after_help = "Example:\n  loopx lark unlink --session-id ses_01JD...")]
    Unlink(LarkSessionArgs),
    /// Show which Lark chat feeds a session.
    #[command(after_help = "Example:\n  loopx lark status --session-id ses_01JD...")]
    Status(LarkSessionArgs),
}

#[derive(Debug, Clone, Args)]
pub struct LarkLinkArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The Lark chat (oc_…), as in the event's `message.chat_id`.
    #[arg(long)]
    pub chat_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct LarkSessionArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// Runs one `loopx lark` command.
pub fn run(args: LarkArgs) -> ExitCode {
    match args.command {
        LarkCommand::Link(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_link(&a.session_id, &a.chat_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
        LarkCommand::Unlink(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_unlink(&a.session_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
        LarkCommand::Status(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_link_status(&a.session_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
    }
}

fn link_text(link: &crate::model::LarkLink) -> String {
    match &link.chat_id {
        Some(chat_id) => format!("session {} is fed by Lark chat {chat_id}", link.session_id),
        None => format!("session {} has no Lark chat linked", link.session_id),
    }
}
