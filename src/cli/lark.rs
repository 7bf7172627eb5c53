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
    /// Link a Lark chat to an open session: its messages join the session's
    /// queue, and its approvers may answer the session's permission requests.
    #[command(
        after_help = "Example:\n  loopx lark link --session-id ses_01JD... --chat-id oc_5ce6d572455d361153b7xx51da133945 \\\n    --approver ou_84aad35d084aa403a838cf73ee18467"
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
    /// A Lark open id (ou_…) who may answer permission requests from the chat
    /// with `yes <id>` / `no <id>`; repeat for several. Linking again replaces
    /// the list; without any, nobody on Lark can answer (the Web page still can).
    #[arg(long = "approver", value_name = "OPEN_ID")]
    pub approvers: Vec<String>,
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
            let answer = ctx
                .client
                .lark_link_approved(&a.session_id, &a.chat_id, &a.approvers)
                .await?;
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
        Some(chat_id) if link.approvers.is_empty() => format!(
            "session {} is fed by Lark chat {chat_id}; nobody there may answer permission requests",
            link.session_id
        ),
        Some(chat_id) => format!(
            "session {} is fed by Lark chat {chat_id}; permission requests may be answered there by {}",
            link.session_id,
            link.approvers.join(", ")
        ),
        None => format!("session {} has no Lark chat linked", link.session_id),
    }
}
