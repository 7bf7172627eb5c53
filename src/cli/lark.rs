//! `loopx lark …`: which Lark chat feeds which session, and the connector's state.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::common::{ClientOptions, with_client};
use crate::model::{LarkConnectionState, LarkConnector, LarkEvents};

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
    /// Make a one-time code that links a Lark chat to an open session: send
    /// the printed `/link <code>` to the bot in that chat (a direct chat with
    /// the bot, or a group it is in) within 10 minutes. You become an
    /// approver of the session there.
    #[command(after_help = "Example:\n  loopx lark pair --session-id ses_01JD...")]
    Pair(LarkSessionArgs),
    /// Unlink the session's Lark chat: its messages are no longer enqueued.
    #[command(after_help = "Example:\n  loopx lark unlink --session-id ses_01JD...")]
    Unlink(LarkSessionArgs),
    /// Show the connector's state (how events arrive; over the long
    /// connection, whether it is connected and why not), or with
    /// --session-id which Lark chat feeds a session.
    #[command(
        after_help = "Example:\n  loopx lark status\n\nExample (a session's link):\n  loopx lark status --session-id ses_01JD..."
    )]
    Status(LarkStatusArgs),
}

#[derive(Debug, Clone, Args)]
pub struct LarkStatusArgs {
    /// The LoopX Chat session (ses_…) whose link to show.
    #[arg(long)]
    pub session_id: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
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
    /// Also send the chat each turn typed at the agent's terminal, with the
    /// agent's answer, as one card (off unless given; linking again without
    /// it turns it off).
    #[arg(long)]
    pub terminal_turns: bool,
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
            let body = crate::model::LarkLinkRequest {
                chat_id: a.chat_id,
                approvers: a.approvers,
                terminal_turns: a.terminal_turns,
            };
            let answer = ctx.client.lark_link_with(&a.session_id, &body).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
        LarkCommand::Pair(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_pair_code(&a.session_id).await?;
            ctx.print(&answer.reply, || answer.body.command.clone());
            Ok(())
        }),
        LarkCommand::Unlink(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.lark_unlink(&a.session_id).await?;
            ctx.print(&answer.reply, || link_text(&answer.body));
            Ok(())
        }),
        LarkCommand::Status(a) => with_client(a.options.clone(), |ctx| async move {
            match &a.session_id {
                Some(session_id) => {
                    let answer = ctx.client.lark_link_status(session_id).await?;
                    ctx.print(&answer.reply, || link_text(&answer.body));
                }
                None => {
                    let answer = ctx.client.lark_connector().await?;
                    ctx.print(&answer.reply, || connector_text(&answer.body));
                }
            }
            Ok(())
        }),
    }
}

fn connector_text(connector: &LarkConnector) -> String {
    let since = connector.since.as_deref().unwrap_or_default();
    let reason = connector.reason.as_deref().unwrap_or_default();
    match (connector.events, connector.state) {
        (LarkEvents::Off, _) => {
            "the Lark connector is off (loopx serve --lark-app-id … --lark-app-secret … turns it on)"
                .into()
        }
        (LarkEvents::Webhook, _) => {
            "the Lark connector receives events by webhook (POST /v1/connectors/lark/events)".into()
        }
        (LarkEvents::LongConnection, Some(LarkConnectionState::Connected)) => format!(
            "Lark long connection: connected since {since} ({} reconnects so far)",
            connector.reconnects
        ),
        (LarkEvents::LongConnection, Some(LarkConnectionState::Retrying)) => {
            format!("Lark long connection: retrying since {since}: {reason}")
        }
        (LarkEvents::LongConnection, Some(LarkConnectionState::Fatal)) => format!(
            "Lark long connection: stopped for good since {since}: {reason} (the rest of the broker serves on; fix the settings and restart it)"
        ),
        (LarkEvents::LongConnection, state) => format!(
            "Lark long connection: {} since {since}",
            match state {
                Some(LarkConnectionState::Stopped) => "stopped",
                _ => "connecting",
            }
        ),
    }
}

fn link_text(link: &crate::model::LarkLink) -> String {
    let text = match &link.chat_id {
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
    };
    if link.terminal_turns {
        format!("{text}; turns typed at its terminal are sent there too")
    } else {
        text
    }
}
