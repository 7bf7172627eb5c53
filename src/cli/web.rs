//! `loopx web …`: sign a phone in to the Web page with a one-time link
//! (printed, and drawn as a QR code in the terminal), list the devices
//! signed in, revoke one. The owner token stays on this machine: the phone
//! gets a credential of its own ([`crate::devices`]).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use qrcode::QrCode;
use qrcode::render::unicode::Dense1x2;

use super::common::{ClientOptions, Format, stdout_line, with_client};
use crate::model::DeviceList;

/// The Web page on other devices: sign-in links and the devices signed in.
#[derive(Debug, Args)]
pub struct WebArgs {
    #[command(subcommand)]
    pub command: WebCommand,
}

#[derive(Debug, Subcommand)]
pub enum WebCommand {
    /// Print a one-time link (and its QR code) that signs a phone in to the
    /// Web page with a credential of its own: good once, for 10 minutes.
    /// `--format json` prints `{"url", "expires_at"}`.
    #[command(
        after_help = "Example:\n  loopx web link --base-url https://laptop.tailnet-name.ts.net"
    )]
    Link(LinkArgs),
    /// List the devices signed in: id, name, when signed in, when last seen.
    #[command(after_help = "Example:\n  loopx web devices")]
    Devices(ClientArgs),
    /// Revoke a device: its next request is refused.
    #[command(after_help = "Example:\n  loopx web revoke --device-id dev_01JD...")]
    Revoke(RevokeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct LinkArgs {
    /// The address the phone opens the page at (a tailnet name, a tunnel, a
    /// reverse proxy) [default: the broker URL].
    #[arg(long, value_parser = super::common::parse_broker_url)]
    pub base_url: Option<String>,
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    #[command(flatten)]
    pub options: ClientOptions,
}

#[derive(Debug, Clone, Args)]
pub struct RevokeArgs {
    /// The device (dev_…), as `loopx web devices` lists it.
    #[arg(long)]
    pub device_id: String,
    #[command(flatten)]
    pub options: ClientOptions,
}

/// Runs one `loopx web` command.
pub fn run(args: WebArgs) -> ExitCode {
    match args.command {
        WebCommand::Link(a) => {
            let base = a
                .base_url
                .clone()
                .unwrap_or_else(|| a.options.connection.broker_url.clone());
            with_client(a.options.clone(), |ctx| async move {
                let answer = ctx.client.device_link().await?;
                let url = format!("{base}/#link={}", answer.body.code);
                match ctx.format {
                    Format::Json => stdout_line(
                        &serde_json::json!({"url": url, "expires_at": answer.body.expires_at})
                            .to_string(),
                    ),
                    Format::Text => stdout_line(&link_text(&url, &answer.body.expires_at)),
                }
                Ok(())
            })
        }
        WebCommand::Devices(a) => with_client(a.options.clone(), |ctx| async move {
            let answer = ctx.client.devices().await?;
            ctx.print(&answer.reply, || devices_text(&answer.body));
            Ok(())
        }),
        WebCommand::Revoke(a) => with_client(a.options.clone(), |ctx| async move {
            ctx.client.revoke_device(&a.device_id).await?;
            match ctx.format {
                Format::Json => {
                    stdout_line(&serde_json::json!({"revoked": a.device_id}).to_string())
                }
                Format::Text => stdout_line(&format!("revoked {}", a.device_id)),
            }
            Ok(())
        }),
    }
}

/// The link, its QR code drawn with half-block characters, and its expiry.
fn link_text(url: &str, expires_at: &str) -> String {
    let qr = QrCode::new(url.as_bytes())
        .map(|code| {
            code.render::<Dense1x2>()
                .dark_color(Dense1x2::Light)
                .light_color(Dense1x2::Dark)
                .quiet_zone(true)
                .build()
        })
        .unwrap_or_default();
    format!(
        "Open this link on the phone (good once, until {expires_at}):\n\n  {url}\n\n{qr}\n\
         It signs the phone in with a credential of its own; `loopx web devices` lists it, \
         `loopx web revoke` ends it."
    )
}

fn devices_text(list: &DeviceList) -> String {
    if list.devices.is_empty() {
        return "no devices signed in (`loopx web link` signs one in)".into();
    }
    list.devices
        .iter()
        .map(|d| {
            let seen = d.last_seen_at.as_deref().unwrap_or("never");
            format!(
                "{}  {}  signed in {}  last seen {seen}",
                d.device_id, d.name, d.created_at
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
