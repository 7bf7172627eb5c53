//! A permission request's Lark card (schema 2.0) and the answers to a click
//! on it: the open card (tool, description, the input preview as a code
//! block, Allow / Deny buttons whose callback `value` names the session, the
//! request and the answer), its final form (who answered what, no buttons),
//! and the toasts. Texts are in English and Chinese side by side: LARK.md
//! describes no `i18n` fields for cards or toasts, and a chat mixes both
//! languages. Everything that comes from the agent is escaped, the preview
//! is never interpreted. It decides nothing and knows no SQL.

use serde::Deserialize;
use serde_json::{Value, json};

use super::markdown::escape_html;
use crate::decide::chat::Listed;
use crate::decide::pairing::{Note, SessionName};
use crate::decide::terminal::FEED_CHARS;
use crate::model::{AnsweredVia, Behavior, PermissionState};
use crate::permission::PermissionRow;

/// How much of the description and of the preview a card shows (the Web
/// page shows them whole); it keeps a card far below Lark's 30 KB.
const DESCRIPTION_CHARS: usize = 500;
const PREVIEW_CHARS: usize = 1500;

/// What a button sends back when it is clicked (its callback `value`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ButtonValue {
    pub session_id: String,
    pub request_id: String,
    pub behavior: Behavior,
}

/// The card a linked chat receives for a new request, its header naming
/// the session.
pub fn open(row: &PermissionRow, name: &SessionName) -> Value {
    let id = escape_html(&row.request_id);
    let mut elements = about(row);
    elements.push(json!({"tag": "column_set", "columns": [
        button(row, Behavior::Allow, "Allow · 允许", "primary_filled"),
        button(row, Behavior::Deny, "Deny · 拒绝", "danger"),
    ]}));
    elements.push(markdown(&format!(
        "Approvers of this chat only. Or reply \"yes {id}\" to allow, \"no {id}\" to deny.\n\
         仅本群审批人可操作。也可回复 \"yes {id}\" 允许，\"no {id}\" 拒绝。"
    )));
    card(
        &named("Permission request · 权限请求", name),
        "orange",
        elements,
    )
}

/// The card once the request is settled: what was answered, by whom (the
/// approver's open id, when a click or `yes <id>` in Lark answered), no
/// buttons; its header naming the session.
pub fn settled(row: &PermissionRow, name: &SessionName, by: Option<&str>) -> Value {
    let (title, template) = match row.state {
        PermissionState::Allowed => ("Allowed · 已允许", "green"),
        PermissionState::Denied => ("Denied · 已拒绝", "red"),
        PermissionState::Expired => ("No longer open · 已失效", "grey"),
        PermissionState::Pending => return open(row, name),
    };
    let mut elements = about(row);
    elements.push(markdown(&outcome(row, by)));
    card(&named(title, name), template, elements)
}

/// A card's title followed by the session it is about: `title: goal · agent`.
pub fn named(title: &str, name: &SessionName) -> String {
    format!("{title}: {}", title_of(name))
}

/// The broker's answer to a command in a chat.
pub fn note(note: &Note) -> Value {
    match note {
        Note::Linked(name) => card(
            &named("Linked · 已关联", name),
            "green",
            vec![markdown(&format!(
                "This chat is linked to **{}** ({}), now its current session: messages here \
                 go to it (`/list` shows the chat's sessions, `/use N` switches), and you may \
                 answer its permission requests.\n\
                 本会话已关联到 **{}**（{}），它现在是当前会话：此处的消息会发给它（`/list` 列出会话，\
                 `/use N` 切换），你可以处理它的权限请求。",
                escape_html(&title_of(name)),
                escape_html(&name.host_surface),
                escape_html(&title_of(name)),
                escape_html(&name.host_surface),
            ))],
        ),
        Note::BadCode => card(
            "Not linked · 未关联",
            "red",
            vec![markdown(
                "This code is not valid: it is wrong, used or expired. Ask for a new one \
                 (`loopx lark pair --session-id …` or the Web page).\n\
                 此配对码无效：错误、已使用或已过期。请重新获取（`loopx lark pair --session-id …` 或网页）。",
            )],
        ),
        Note::Throttled => card(
            "Not linked · 未关联",
            "red",
            vec![markdown(
                "Too many wrong codes from this chat: try again in a few minutes.\n\
                 本会话输入错误配对码的次数过多，请几分钟后再试。",
            )],
        ),
        Note::Help => card("Commands · 命令", "blue", vec![markdown(HELP)]),
        Note::NoSession => card(
            "No session · 未关联会话",
            "grey",
            vec![markdown(
                "This chat is linked to no session. Pair one: `loopx lark pair --session-id …` \
                 (or the Web page) prints `/link <code>`; send it here.\n\
                 本会话尚未关联。用 `loopx lark pair --session-id …`（或网页）获取 `/link <code>`，然后发到这里。",
            )],
        ),
        Note::List(sessions) => card("Sessions · 会话", "blue", vec![markdown(&listed(sessions))]),
        Note::Status(sessions) => card("Status · 状态", "blue", vec![markdown(&listed(sessions))]),
        Note::Current(name) => about_session(
            "Current · 当前",
            "blue",
            name,
            "Messages here go to {} now.\n此处的消息现在发给 {}。",
        ),
        Note::Unlinked(name) => about_session(
            "Unlinked · 已取消关联",
            "grey",
            name,
            "{} no longer gets this chat's messages.\n{} 不再接收此处的消息。",
        ),
        Note::NoSuchSession => card(
            "No such session · 没有这个会话",
            "orange",
            vec![markdown(
                "That names none of this chat's sessions: see `/list`.\n没有对应的会话，请查看 `/list`。",
            )],
        ),
        Note::Stalled(name) => about_session(
            "Stalled · 停滞",
            "orange",
            name,
            "{} is working but has said nothing for a while: it may be stuck, or running something long. \
             The next thing it does clears this.\n{} 正在工作，但已有一段时间没有任何动静：可能卡住了，也可能在执行耗时的任务。",
        ),
        Note::Terminal {
            name,
            prompt,
            answer,
        } => card(
            &named("At the terminal · 终端", name),
            "wathet",
            vec![
                markdown(&format!(
                    "**Typed at the terminal · 终端输入**\n{}",
                    code_block(&cut(prompt, FEED_CHARS))
                )),
                markdown(&format!(
                    "**Answer · 回答**\n{}",
                    escape_html(&cut(answer, FEED_CHARS))
                )),
            ],
        ),
        Note::Closed(name) => about_session(
            "Closed · 已关闭",
            "grey",
            name,
            "{} was closed: it left this chat's list.\n{} 已关闭，已从此处的会话列表中移除。",
        ),
    }
}

/// A note about one session: its title names it, and each `{}` of `text`
/// is its name in bold.
fn about_session(title: &str, template: &str, name: &SessionName, text: &str) -> Value {
    let bold = format!("**{}**", escape_html(&title_of(name)));
    card(
        &named(title, name),
        template,
        vec![markdown(&text.replace("{}", &bold))],
    )
}

/// What `/help` says.
const HELP: &str = "`/list` this chat's sessions · 列出会话\n\
    `/use N` send to session N (or a unique start of its goal or agent) · 切换当前会话\n\
    `/status` what each agent is doing · 各代理的状态\n\
    `/unlink N` unlink session N from this chat · 取消关联\n\
    `/link <code>` link a session by its code (`loopx lark pair`) · 用配对码关联会话\n\
    `//text` sends `/text` to the agent · 发送以 / 开头的文字\n\
    Anything else goes to the current session · 其他消息发给当前会话";

/// The chat's sessions, numbered: goal · agent, host surface, presence (and
/// the tool a working agent runs), and which is current.
fn listed(sessions: &[Listed]) -> String {
    sessions
        .iter()
        .map(|s| {
            format!(
                "{}. **{}** ({}): {}{}{}",
                s.number,
                escape_html(&title_of(&s.name)),
                escape_html(&s.name.host_surface),
                s.presence.as_str(),
                s.tool
                    .as_deref()
                    .map(|tool| format!(" ({})", escape_html(tool)))
                    .unwrap_or_default(),
                if s.current {
                    " · current · 当前"
                } else {
                    ""
                },
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A session's name as cards show it: goal · agent.
pub fn title_of(name: &SessionName) -> String {
    format!("{} · {}", name.goal_id, name.agent_id)
}

/// Who answered what, in both languages.
fn outcome(row: &PermissionRow, by: Option<&str>) -> String {
    let (en, zh) = match row.state {
        PermissionState::Denied => ("Denied", "拒绝"),
        PermissionState::Expired => {
            return "Not answered here: answered at the terminal, withdrawn, or the session closed.\n\
                    未在此处理：已在终端处理、已撤回，或会话已关闭。"
                .into();
        }
        _ => ("Allowed", "允许"),
    };
    match (row.answered_via, by) {
        (Some(AnsweredVia::Lark), Some(by)) if is_open_id(by) => {
            format!("**{en}** by <at id={by}></at> in Lark.\n已由 <at id={by}></at> 在飞书中{zh}。")
        }
        (Some(AnsweredVia::Lark), _) => format!("**{en}** in Lark.\n已在飞书中{zh}。"),
        _ => format!("**{en}** on the Web page.\n已在网页上{zh}。"),
    }
}

/// A toast for the person who clicked.
pub fn toast(kind: &str, content: &str) -> Value {
    json!({"type": kind, "content": content})
}

/// The toast of an answer that this click gave.
pub fn answered_toast(state: PermissionState) -> Value {
    match state {
        PermissionState::Denied => toast("success", "Denied · 已拒绝"),
        _ => toast("success", "Allowed · 已允许"),
    }
}

/// The toast of a click on a request settled before it.
pub fn settled_toast(state: PermissionState) -> Value {
    match state {
        PermissionState::Allowed => toast("info", "Already allowed · 已被允许"),
        PermissionState::Denied => toast("info", "Already denied · 已被拒绝"),
        _ => toast("info", "No longer open · 已失效"),
    }
}

/// The toast of a click by someone not on the link's approver list.
pub fn refused_toast() -> Value {
    toast(
        "warning",
        "Only this chat's approvers may answer · 只有本群的审批人可以处理",
    )
}

/// The toast of a click naming no request the broker has.
pub fn unknown_toast() -> Value {
    toast("error", "Unknown request · 未知的请求")
}

/// A callback answer: the toast, and the card that replaces the clicked one.
pub fn callback(toast: Value, card: Option<Value>) -> Value {
    match card {
        Some(card) => json!({"toast": toast, "card": {"type": "raw", "data": card}}),
        None => json!({"toast": toast}),
    }
}

/// The tool, the description and the input preview as a code block.
fn about(row: &PermissionRow) -> Vec<Value> {
    let mut elements = vec![markdown(&format!(
        "**{}**: {}",
        escape_html(&row.tool_name),
        escape_html(&cut(&row.description, DESCRIPTION_CHARS)),
    ))];
    if !row.input_preview.is_empty() {
        elements.push(markdown(&code_block(&cut(
            &row.input_preview,
            PREVIEW_CHARS,
        ))));
    }
    elements
}

/// A fenced code block that no backtick run in `text` can close, its HTML
/// escaped: the preview shows as it is, never interpreted.
fn code_block(text: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat((longest + 1).max(3));
    format!("{fence}\n{}\n{fence}", escape_html(text))
}

fn button(row: &PermissionRow, behavior: Behavior, text: &str, kind: &str) -> Value {
    json!({"tag": "column", "width": "auto", "elements": [{
        "tag": "button",
        "type": kind,
        "text": {"tag": "plain_text", "content": text},
        "behaviors": [{"type": "callback", "value": {
            "session_id": row.session_id,
            "request_id": row.request_id,
            "behavior": behavior,
        }}],
    }]})
}

fn markdown(content: &str) -> Value {
    json!({"tag": "markdown", "content": content})
}

fn card(title: &str, template: &str, elements: Vec<Value>) -> Value {
    json!({
        "schema": "2.0",
        "config": {"update_multi": true},
        "header": {"title": {"tag": "plain_text", "content": title}, "template": template},
        "body": {"elements": elements},
    })
}

fn is_open_id(id: &str) -> bool {
    crate::permission::approvers(vec![id.to_owned()]).is_ok()
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::permission::tests::created;
    use crate::decide::tests::session;
    use crate::model::SessionState;

    fn name() -> SessionName {
        SessionName::of(&session(SessionState::Open))
    }

    fn buttons(card: &Value) -> Vec<Value> {
        card["body"]["elements"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["tag"] == "column_set")
            .flat_map(|set| set["columns"].as_array().unwrap().clone())
            .map(|column| column["elements"][0].clone())
            .collect()
    }

    #[test]
    fn an_open_card_has_two_buttons_naming_the_request_and_the_answer() {
        let card = open(&created(), &name());
        assert_eq!(
            card["header"]["title"]["content"],
            "Permission request · 权限请求: g · a"
        );
        let buttons = buttons(&card);
        assert_eq!(buttons.len(), 2);
        let values: Vec<ButtonValue> = buttons
            .iter()
            .map(|b| serde_json::from_value(b["behaviors"][0]["value"].clone()).unwrap())
            .collect();
        assert_eq!(values[0].behavior, Behavior::Allow);
        assert_eq!(values[1].behavior, Behavior::Deny);
        assert!(values.iter().all(|v| v.request_id == "abcde"));
        assert!(card.to_string().contains("yes abcde"));
    }

    #[test]
    fn the_preview_is_an_escaped_code_block_no_backticks_can_close() {
        let row = PermissionRow {
            input_preview: "echo ```\n</script>".into(),
            ..created()
        };
        let text = open(&row, &name()).to_string();
        assert!(
            text.contains("````\\necho ```\\n&lt;/script&gt;\\n````"),
            "{text}"
        );
        assert!(!text.contains("</script>"));
    }

    #[test]
    fn a_settled_card_says_who_answered_what_without_buttons() {
        let row = PermissionRow {
            state: PermissionState::Denied,
            answered_via: Some(AnsweredVia::Lark),
            ..created()
        };
        let card = settled(&row, &name(), Some("ou_ann"));
        assert!(
            card["header"]["title"]["content"]
                .as_str()
                .unwrap()
                .ends_with(": g · a")
        );
        assert!(buttons(&card).is_empty());
        assert!(card.to_string().contains("<at id=ou_ann></at>"));
        assert!(card.to_string().contains("Denied"));
        let odd = settled(&row, &name(), Some("ou_<b>"));
        assert!(!odd.to_string().contains("<b>"));
        let web = PermissionRow {
            answered_via: Some(AnsweredVia::Owner),
            ..row
        };
        assert!(
            settled(&web, &name(), None)
                .to_string()
                .contains("Web page")
        );
    }
}
