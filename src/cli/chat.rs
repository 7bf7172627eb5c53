//! `loopx chat …`: the people side, queue a message for a session and read a
//! turn back.

use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

use super::common::{ClientOptions, Ctx, with_client};
use crate::client::ClientError;
use crate::model::wire;
use crate::model::{EnqueueRequest, Origin, Turn, TurnState};

/// The people side: queue a message for a session and read a turn back.
#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(subcommand)]
    pub command: ChatCommand,
}

#[derive(Debug, Subcommand)]
pub enum ChatCommand {
    /// Queue a message for the agent behind a session.
    ///
    /// Web and connector messages share the session's one ordered queue. With
    /// --client-message-id the send is idempotent for the life of the
    /// session: repeating it answers the same turn.
    #[command(
        after_help = "Example:\n  loopx chat send --session-id ses_01JD... --text \"Please summarise the failing test.\""
    )]
    Send(ChatSendArgs),
    /// Show one turn: its message, its state and, once completed, the response.
    #[command(
        after_help = "Example:\n  loopx chat show --session-id ses_01JD... --turn-id turn_01JD..."
    )]
    Show(ChatShowArgs),
}

/// Where a message comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OriginArg {
    Web,
    Lark,
}

#[derive(Debug, Clone, Args)]
pub struct ChatSendArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The message, 1 byte to 64 KiB.
    #[arg(long)]
    pub text: String,
    /// Where the message comes from.
    #[arg(long, value_enum, default_value_t = OriginArg::Web)]
    pub origin: OriginArg,
    /// Makes the send idempotent: the same id answers the same turn.
    #[arg(long)]
    pub client_message_id: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct ChatShowArgs {
    /// The LoopX Chat session (ses_…).
    #[arg(long)]
    pub session_id: String,
    /// The turn (turn_…).
    #[arg(long)]
    pub turn_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// Runs one `loopx chat` command.
pub fn run(args: ChatArgs) -> ExitCode {
    match args.command {
        ChatCommand::Send(a) => with_client(a.options.clone(), |c| send(c, a)),
        ChatCommand::Show(a) => with_client(a.options.clone(), |c| show(c, a)),
    }
}

async fn send(ctx: Ctx, a: ChatSendArgs) -> Result<(), ClientError> {
    let message = EnqueueRequest {
        attachments: Vec::new(),
        origin: match a.origin {
            OriginArg::Web => Origin::Web,
            OriginArg::Lark => Origin::Lark,
        },
        text: a.text,
        client_message_id: a.client_message_id,
        ingress: Default::default(),
        lark: None,
    };
    let answer = ctx.client.enqueue(&a.session_id, &message).await?;
    let e = &answer.body;
    ctx.print(&answer.reply, || {
        if e.duplicate {
            format!(
                "already queued as turn {} (seq {}, now {}): the client message id was sent before",
                e.turn_id,
                e.seq,
                wire(&e.state)
            )
        } else {
            format!(
                "queued turn {} (seq {}) in session {}",
                e.turn_id, e.seq, a.session_id
            )
        }
    });
    Ok(())
}

async fn show(ctx: Ctx, a: ChatShowArgs) -> Result<(), ClientError> {
    let answer = ctx.client.turn(&a.session_id, &a.turn_id).await?;
    ctx.print(&answer.reply, || turn_text(&answer.body));
    Ok(())
}

/// A turn's state for people: a claimed turn is with the agent, which is
/// what the person who sent it wants to know (the Web page says the same);
/// a turn typed at the terminal was never delivered, the agent just has it.
fn state_text(t: &Turn) -> String {
    match (t.state, t.origin) {
        (TurnState::Claimed, Origin::Terminal) => "claimed (the agent is working on it)".into(),
        (TurnState::Claimed, _) => {
            "claimed (delivered to the agent, which is working on it)".into()
        }
        (other, _) => wire(&other),
    }
}

fn turn_text(t: &Turn) -> String {
    let mut lines = vec![format!(
        "turn {} (seq {}) from {}: {}",
        t.turn_id,
        t.seq,
        wire(&t.origin),
        state_text(t)
    )];
    let mut times = vec![format!("enqueued {}", t.enqueued_at)];
    if let Some(at) = &t.claimed_at {
        times.push(format!("claimed {at}"));
    }
    if let Some(at) = &t.completed_at {
        times.push(format!("completed {at}"));
    }
    if let Some(reason) = &t.cancel_reason {
        times.push(format!("cancelled: {}", wire(reason)));
    }
    lines.push(times.join(", "));
    lines.push(format!("message:\n{}", t.text));
    if let Some(reply) = &t.reply {
        let error = reply
            .error
            .as_deref()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        lines.push(format!(
            "reply to {}: {} after {} attempt(s){error}",
            reply.channel,
            wire(&reply.state),
            reply.attempts
        ));
    }
    if let Some(response) = &t.response {
        let message = response.get("message").and_then(Value::as_str);
        lines.push(format!("response:\n{}", message.unwrap_or("(no message)")));
        let others = response.as_object().map_or(0, |o| o.len()) - usize::from(message.is_some());
        if others > 0 {
            lines.push(format!(
                "(+{others} more response field(s); --format json shows them)"
            ));
        }
    }
    lines.join("\n")
}
