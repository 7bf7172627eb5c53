//! A permission request's Lark card (schema 2.0) and the answers to a click
//! on it: the open card (tool, description, the input preview as a code
//! block, Allow / Deny buttons whose callback `value` names the session, the
//! request and the answer), its final form (who answered what, no buttons),
//! and the toasts. Texts are in English and Chinese side by side: LARK.md
//! describes no `i18n` fields for cards or toasts, and a chat mixes both
//! languages. Everything that comes from the agent is escaped, the preview
//! is never interpreted. It decides nothing and knows no SQL.

use std::fmt;

use serde::Deserialize;
use serde_json::{Value, json};

use super::markdown::escape_html;
use crate::decide::notice::{Ask, Choice, FEED_CHARS, Listed, Missing, Note, Picked, SessionName};
use crate::model::{
    AgentState, AnsweredVia, Behavior, ChosenAnswer, PermissionKind, PermissionState, PlanMode,
    Question,
};
use crate::permission::{Detail, MAX_QUESTIONS, PermissionRow};

/// How much of the description and of the preview a card shows (the Web
/// page shows them whole); it keeps a card far below Lark's 30 KB.
const DESCRIPTION_CHARS: usize = 500;
const PREVIEW_CHARS: usize = 1500;

/// How much of a plan a card shows, in bytes of the request body (Lark's
/// card limit is 30 KB; the rest of the card and its envelope fit in what
/// is left).
const PLAN_BYTES: usize = 20_000;
/// How much of a question, an option's description or an answer a card
/// shows, and of a label on a button or in a select (Lark: ≤ 100).
const WORDS_CHARS: usize = 500;
const LABEL_CHARS: usize = 90;
/// Lark's longest `input` (characters).
const INPUT_CHARS: usize = 1000;

/// What a button sends back when it is clicked (its callback `value`):
/// the session, the request, the answer, and what it chooses beyond allow
/// or deny (issue 54). A form's submit button says which form it sends.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ButtonValue {
    pub session_id: String,
    pub request_id: String,
    pub behavior: Behavior,
    #[serde(default)]
    pub suggestion: Option<u32>,
    #[serde(default)]
    pub mode: Option<PlanMode>,
    /// An option of the request's only question (one tap answers it).
    #[serde(default)]
    pub option: Option<u32>,
    /// `answers` (a question card's form) or `feedback` (a plan's).
    #[serde(default)]
    pub form: Option<String>,
}

/// The form names a question card's fields take: its options `q<n>`, its
/// own words `a<n>`; a plan's feedback `feedback`.
const ANSWERS_FORM: &str = "answers";
const FEEDBACK_FORM: &str = "feedback";

impl ButtonValue {
    /// What the click chooses, its form's values (`action.form_value`: a
    /// field name to a string, or to strings for a multi-select) read back.
    pub fn choice(&self, form_value: &Value) -> Choice {
        if let Some(index) = self.suggestion {
            return Choice::Suggestion(index);
        }
        if let Some(mode) = self.mode {
            return Choice::Mode(mode);
        }
        if let Some(option) = self.option {
            return Choice::Option(option);
        }
        let text = |name: &str| form_value[name].as_str().unwrap_or_default().to_owned();
        match self.form.as_deref() {
            Some(ANSWERS_FORM) => Choice::Answers(
                (0..MAX_QUESTIONS)
                    .map(|n| Picked {
                        options: picks(&form_value[format!("q{n}")]),
                        text: text(&format!("a{n}")),
                    })
                    .collect(),
            ),
            Some(FEEDBACK_FORM) => Choice::Feedback(text(FEEDBACK_FORM)),
            _ => Choice::Plain,
        }
    }
}

/// A select's value: one option index, or several.
fn picks(value: &Value) -> Vec<u32> {
    let one = |v: &Value| v.as_str().and_then(|s| s.parse().ok());
    match value {
        Value::Array(values) => values.iter().filter_map(one).collect(),
        value => one(value).into_iter().collect(),
    }
}

/// A request as its chat is asked it: the open card's JSON.
impl fmt::Display for Ask<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", open(self.request, self.name))
    }
}

/// A note as its chat shows it: the card's JSON.
impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", note(self))
    }
}

/// The card a linked chat receives for a new request, its header naming
/// the session: a tool's with Allow / Deny and its "always allow" choices,
/// a question's with its options, a plan's with its approvals.
pub fn open(row: &PermissionRow, name: &SessionName) -> Value {
    let detail = row.detail();
    match detail.kind {
        PermissionKind::Tool => tool_card(row, name, &detail),
        PermissionKind::Question => question_card(row, name, &detail),
        PermissionKind::Plan => plan_card(row, name, &detail),
    }
}

fn tool_card(row: &PermissionRow, name: &SessionName, detail: &Detail) -> Value {
    let id = escape_html(&row.request_id);
    let mut elements = about(row);
    elements.push(json!({"tag": "column_set", "columns": [
        button(row, Behavior::Allow, "Allow · 允许", "primary_filled", json!({})),
        button(row, Behavior::Deny, "Deny · 拒绝", "danger", json!({})),
    ]}));
    for (n, suggestion) in detail.suggestions.iter().enumerate() {
        let text = cut(&suggestion.label, LABEL_CHARS);
        let extra = json!({ "suggestion": n });
        elements.push(row_of(button(
            row,
            Behavior::Allow,
            &text,
            "primary",
            extra,
        )));
    }
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

/// A question card: each question with its options described; for a
/// single question that takes one option, a button per option (one tap
/// answers); a form with a select (or multi-select) per question and an
/// input for the person's own words; Decline.
fn question_card(row: &PermissionRow, name: &SessionName, detail: &Detail) -> Value {
    let questions = detail.questions.as_deref().unwrap_or_default();
    let mut elements: Vec<Value> = questions.iter().map(asked).collect();
    let one_tap = matches!(questions, [only] if !only.multi_select);
    if one_tap {
        for (n, option) in questions[0].options.iter().enumerate() {
            let text = cut(&option.label, LABEL_CHARS);
            let extra = json!({ "option": n });
            elements.push(row_of(button(
                row,
                Behavior::Allow,
                &text,
                "primary",
                extra,
            )));
        }
    }
    let mut fields = Vec::new();
    for (n, question) in questions.iter().enumerate() {
        if !one_tap {
            fields.push(select(n, question));
        }
        fields.push(json!({
            "tag": "input",
            "name": format!("a{n}"),
            "max_length": INPUT_CHARS,
            "placeholder": {"tag": "plain_text", "content": match (one_tap, questions.len()) {
                (true, _) => "Or your own answer · 或自己回答".to_owned(),
                (false, 1) => "Or your own words · 或自己回答".to_owned(),
                (false, _) => format!("Or your own words for question {} · 或自己回答第 {} 题", n + 1, n + 1),
            }},
        }));
    }
    let send = if one_tap {
        "Send my answer · 发送"
    } else {
        "Send answers · 发送回答"
    };
    fields.push(submit(row, Behavior::Allow, send, ANSWERS_FORM));
    elements.push(json!({"tag": "form", "name": ANSWERS_FORM, "elements": fields}));
    elements.push(json!({"tag": "column_set", "columns": [
        button(row, Behavior::Deny, "Decline · 拒绝", "danger", json!({})),
    ]}));
    elements.push(markdown(
        "Approvers of this chat only; or answer on the Web page.\n仅本群审批人可操作；也可在网页上回答。",
    ));
    card(&named("Question · 提问", name), "orange", elements)
}

/// A question as a card shows it: its header, its text, its options.
fn asked(question: &Question) -> Value {
    let mut text = match question.header.trim() {
        "" => String::new(),
        header => format!("**{}** · ", escape_html(&cut(header, LABEL_CHARS))),
    };
    text.push_str(&escape_html(&cut(&question.question, WORDS_CHARS)));
    if question.multi_select {
        text.push_str(" *(one or more · 可多选)*");
    }
    for option in &question.options {
        text.push_str(&format!(
            "\n- **{}**",
            escape_html(&cut(&option.label, LABEL_CHARS))
        ));
        if !option.description.trim().is_empty() {
            let description = cut(&option.description, WORDS_CHARS);
            text.push_str(&format!(": {}", escape_html(&description)));
        }
    }
    markdown(&text)
}

/// A question's select: each option's value is its index.
fn select(n: usize, question: &Question) -> Value {
    let options: Vec<Value> = question
        .options
        .iter()
        .enumerate()
        .map(|(i, option)| {
            json!({
                "text": {"tag": "plain_text", "content": cut(&option.label, LABEL_CHARS)},
                "value": i.to_string(),
            })
        })
        .collect();
    let (tag, hint) = match question.multi_select {
        true => ("multi_select_static", "Choose one or more · 可多选"),
        false => ("select_static", "Choose one · 选择一项"),
    };
    let hint = match question.header.trim() {
        "" => hint.to_owned(),
        header => format!("{} · {hint}", cut(header, LABEL_CHARS)),
    };
    json!({
        "tag": tag,
        "name": format!("q{n}"),
        "placeholder": {"tag": "plain_text", "content": hint},
        "options": options,
    })
}

/// A plan card: the plan as Markdown (cut below the card limit, saying so),
/// two approvals, and "Keep planning…" with the person's feedback.
fn plan_card(row: &PermissionRow, name: &SessionName, detail: &Detail) -> Value {
    let mut elements = plan_shown(detail);
    elements.push(json!({"tag": "column_set", "columns": [
        button(row, Behavior::Allow, "Approve, auto-accept edits · 批准并自动接受编辑", "primary_filled",
            json!({"mode": PlanMode::AcceptEdits})),
        button(row, Behavior::Allow, "Approve, review each edit · 批准并逐一审阅", "primary",
            json!({"mode": PlanMode::Default})),
    ]}));
    elements.push(json!({"tag": "form", "name": FEEDBACK_FORM, "elements": [
        {
            "tag": "input",
            "name": FEEDBACK_FORM,
            "max_length": INPUT_CHARS,
            "placeholder": {"tag": "plain_text", "content": "What should change? · 需要修改什么？"},
        },
        submit(row, Behavior::Deny, "Keep planning… · 继续规划…", FEEDBACK_FORM),
    ]}));
    elements.push(markdown(
        "Approvers of this chat only; or answer on the Web page.\n仅本群审批人可操作；也可在网页上回答。",
    ));
    card(&named("Plan · 计划", name), "orange", elements)
}

/// The plan as a card shows it, cut below the card limit with a note.
fn plan_shown(detail: &Detail) -> Vec<Value> {
    let plan = escape_html(detail.plan.as_deref().unwrap_or_default());
    let (shown, cut) = super::markdown::head(&plan, PLAN_BYTES);
    let mut elements = vec![markdown(&shown)];
    if cut {
        elements.push(markdown(
            "*The plan is longer than a card holds: the Web page shows it whole.*\n\
             *计划超出卡片长度：完整内容请在网页上查看。*",
        ));
    }
    elements
}

/// The card once the request is settled: what was answered, by whom (the
/// approver's open id, when a click or `yes <id>` in Lark answered), no
/// buttons; its header naming the session.
pub fn settled(row: &PermissionRow, name: &SessionName, by: Option<&str>) -> Value {
    let (title, template) = match (row.state, row.answered_via) {
        (PermissionState::Allowed, _) => ("Allowed · 已允许", "green"),
        (PermissionState::Denied, _) => ("Denied · 已拒绝", "red"),
        (PermissionState::Expired, Some(AnsweredVia::Terminal)) => {
            ("Answered at the terminal · 已在终端处理", "grey")
        }
        (PermissionState::Expired, _) => ("No longer open · 已失效", "grey"),
        (PermissionState::Pending, _) => return open(row, name),
    };
    let detail = row.detail();
    let mut elements = match detail.kind {
        PermissionKind::Tool => about(row),
        PermissionKind::Question => detail.questions.iter().flatten().map(asked).collect(),
        PermissionKind::Plan => plan_shown(&detail),
    };
    elements.push(markdown(&outcome(row, by)));
    if let Some(chosen) = chosen(row, &detail) {
        elements.push(markdown(&chosen));
    }
    card(&named(title, name), template, elements)
}

/// What was chosen with the answer, as the settled card says it.
fn chosen(row: &PermissionRow, detail: &Detail) -> Option<String> {
    let ChosenAnswer {
        message,
        answers,
        suggestion,
        mode,
    } = row.chosen()?;
    let mut lines = Vec::new();
    for question in detail.questions.iter().flatten() {
        if let Some(answer) = answers.as_ref().and_then(|a| a.get(&question.question)) {
            let asked = match question.header.trim() {
                "" => cut(&question.question, LABEL_CHARS),
                header => cut(header, LABEL_CHARS),
            };
            lines.push(format!(
                "**{}** → {}",
                escape_html(&asked),
                escape_html(&cut(answer, WORDS_CHARS))
            ));
        }
    }
    if let Some(label) = suggestion.and_then(|n| detail.suggestions.get(n as usize)) {
        lines.push(format!(
            "Chosen · 已选择: **{}**",
            escape_html(&cut(&label.label, LABEL_CHARS))
        ));
    }
    match mode {
        Some(PlanMode::AcceptEdits) => {
            lines.push("Approved, auto-accept edits · 已批准，自动接受编辑".into())
        }
        Some(PlanMode::Default) => {
            lines.push("Approved, review each edit · 已批准，逐一审阅编辑".into())
        }
        None => {}
    }
    if let Some(message) = message {
        let said = match detail.kind {
            PermissionKind::Plan => "Keep planning · 继续规划",
            _ => "Message · 留言",
        };
        lines.push(format!(
            "{said}: {}",
            escape_html(&cut(&message, WORDS_CHARS))
        ));
    }
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// A card's title followed by the session it is about: `title: goal · agent`.
pub fn named(title: &str, name: &SessionName) -> String {
    format!("{title}: {}", title_of(name))
}

/// The broker's answer to a command in a chat.
pub fn note(note: &Note) -> Value {
    match note {
        Note::Linked(name) => linked(name),
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
        Note::Changes { name, changes } => changed(name, changes.as_deref()),
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
        } => terminal_turn(name, prompt, answer),
        Note::NeedsAnswers { name, request_id } => needs_answers(name, request_id),
        Note::Continued(name) => about_session(
            "Continued · 已继续",
            "blue",
            name,
            "{} continued after /clear (or a restart): the same conversation goes on here, with its waiting messages.\n{} 已在 /clear（或重启）后继续：同一对话在此继续，待处理的消息也一并保留。",
        ),
        Note::Closed(name) => about_session(
            "Closed · 已关闭",
            "grey",
            name,
            "{} was closed: it left this chat's list.\n{} 已关闭，已从此处的会话列表中移除。",
        ),
    }
}

/// A chat just linked to a session: which, and what the chat may do now.
fn linked(name: &SessionName) -> Value {
    card(
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
    )
}

/// A turn typed at the session's terminal and the agent's answer, each cut
/// at [`FEED_CHARS`].
fn terminal_turn(name: &SessionName, prompt: &str, answer: &str) -> Value {
    card(
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
    )
}

/// A `yes <id>` to a request that asks questions: where to answer them.
fn needs_answers(name: &SessionName, request_id: &str) -> Value {
    card(
        &named("Not answered · 未处理", name),
        "orange",
        vec![markdown(&format!(
            "Request {id} asks questions: \"yes\" cannot answer them. Choose the answers \
             on its card (or on the Web page); \"no {id}\" declines it.\n\
             请求 {id} 需要回答问题，\"yes\" 无法回答。请在卡片（或网页）上选择答案；\"no {id}\" 可拒绝。",
            id = escape_html(request_id),
        ))],
    )
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

/// How many files a `/changes` card lists.
const CHANGES_LISTED: usize = 30;

/// `/changes`: the branch, ahead and behind, each file with its lines
/// added and removed (binary and truncated marked), and the totals.
fn changed(name: &SessionName, changes: Option<&crate::model::Changes>) -> Value {
    let Some(c) = changes else {
        return about_session(
            "Changes · 改动",
            "grey",
            name,
            "{} reported no changes: its hooks report the working tree of a git repository at the end of each turn.
{} 尚未报告改动：钩子会在每轮结束时报告 git 仓库的工作区。",
        );
    };
    let branch = c.branch.as_deref().unwrap_or("detached HEAD");
    let mut text = format!(
        "**{}** · ↑{} ↓{} · {} files changed (+{} −{}) · 共 {} 个文件
",
        escape_html(branch),
        c.ahead,
        c.behind,
        c.files.len(),
        c.added,
        c.removed,
        c.files.len(),
    );
    for f in c.files.iter().take(CHANGES_LISTED) {
        let mark = match (f.binary, f.truncated) {
            (true, _) => " (binary)".to_owned(),
            (_, true) => format!(" +{} −{} (too long to show)", f.added, f.removed),
            _ => format!(" +{} −{}", f.added, f.removed),
        };
        text.push_str(&format!(
            "\n`{}` {}{mark}",
            escape_html(&f.path).replace('`', "'"),
            crate::model::wire(&f.status),
        ));
    }
    if c.files.len() > CHANGES_LISTED {
        let more = c.files.len() - CHANGES_LISTED;
        text.push_str(&format!("\n… and {more} more · 另有 {more} 个"));
    }
    text.push_str("\nThe diffs are on the Web page · 差异见网页");
    card(
        &named("Changes · 改动", name),
        "blue",
        vec![markdown(&text)],
    )
}

/// What `/help` says.
const HELP: &str = "`/list` this chat's sessions · 列出会话\n\
    `/use N` send to session N (or a unique start of its goal or agent) · 切换当前会话\n\
    `/status` what each agent is doing · 各代理的状态\n\
    `/changes` what the agent changed (git) · 代理的改动\n\
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
                "{}. **{}** ({}): {}{}{}{}",
                s.number,
                escape_html(&title_of(&s.name)),
                escape_html(&s.name.host_surface),
                s.presence.as_str(),
                s.tool
                    .as_deref()
                    .map(|tool| format!(" ({})", escape_html(tool)))
                    .unwrap_or_default(),
                resume_hint(s),
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

/// How to bring back an agent that is away (it may have exited: messages
/// wait for it; HOOKS.md "The terminal's real life").
fn resume_hint(s: &Listed) -> &'static str {
    match (s.presence, s.name.host_surface.as_str()) {
        (AgentState::Away, "claude-code") => {
            " · if it exited: `claude --resume`, or `claude` again in its pane · 若已退出请恢复"
        }
        (AgentState::Away, "codex-cli") => {
            " · if it exited: `codex resume`, or `codex` again in its pane · 若已退出请恢复"
        }
        _ => "",
    }
}

/// A session's name as cards show it: goal · agent.
pub fn title_of(name: &SessionName) -> String {
    format!("{} · {}", name.goal_id, name.agent_id)
}

/// Who answered what, in both languages.
fn outcome(row: &PermissionRow, by: Option<&str>) -> String {
    let (en, zh) = match row.state {
        PermissionState::Denied => ("Denied", "拒绝"),
        PermissionState::Expired if row.answered_via == Some(AnsweredVia::Terminal) => {
            return "Answered at the terminal first: this card takes no answer now.\n\
                    已先在终端处理：此卡片不再接受回答。"
                .into();
        }
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

/// The toast of a click on a request settled before it: never an answer.
pub fn settled_toast(row: &PermissionRow) -> Value {
    match (row.state, row.answered_via) {
        (PermissionState::Allowed, _) => {
            toast("info", "Already answered: allowed · 已处理：已允许")
        }
        (PermissionState::Denied, _) => toast("info", "Already answered: denied · 已处理：已拒绝"),
        (_, Some(AnsweredVia::Terminal)) => {
            toast("info", "Already answered at the terminal · 已在终端处理")
        }
        _ => toast("info", "No longer open · 已失效"),
    }
}

/// The toast of an approver's click that left something out: nothing was
/// answered.
pub fn incomplete_toast(missing: &Missing) -> Value {
    let text = match missing {
        Missing::Answers(questions) => {
            let named = questions
                .iter()
                .map(|q| cut(q, 40))
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "Answer each question first, still missing: {named} · 请先回答每个问题，尚缺：{named}"
            )
        }
        Missing::Feedback => "Say what should change first · 请先写下需要修改的内容".to_owned(),
    };
    toast("warning", &text)
}

/// The toast of an approver's click that does not fit the request.
pub fn unfit_toast(message: &str) -> Value {
    toast("error", &format!("Not answered · 未处理: {message}"))
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

/// A button in a column (for a `column_set`): its callback `value` names
/// the session, the request and the answer, and `extra`'s fields.
fn button(row: &PermissionRow, behavior: Behavior, text: &str, kind: &str, extra: Value) -> Value {
    json!({"tag": "column", "width": "auto", "elements": [{
        "tag": "button",
        "type": kind,
        "text": {"tag": "plain_text", "content": text},
        "behaviors": [{"type": "callback", "value": value(row, behavior, extra)}],
    }]})
}

/// A button on a row of its own.
fn row_of(column: Value) -> Value {
    json!({"tag": "column_set", "columns": [column]})
}

/// A form's submit button: its `value` says which form it sends.
fn submit(row: &PermissionRow, behavior: Behavior, text: &str, form: &str) -> Value {
    json!({
        "tag": "button",
        "name": format!("{form}_submit"),
        "form_action_type": "submit",
        "type": "primary_filled",
        "text": {"tag": "plain_text", "content": text},
        "behaviors": [{"type": "callback", "value": value(row, behavior, json!({"form": form}))}],
    })
}

fn value(row: &PermissionRow, behavior: Behavior, extra: Value) -> Value {
    let mut value = json!({
        "session_id": row.session_id,
        "request_id": row.request_id,
        "behavior": behavior,
    });
    if let (Some(value), Value::Object(extra)) = (value.as_object_mut(), extra) {
        value.extend(extra);
    }
    value
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
    fn a_forms_values_are_read_back_into_the_choice() {
        let value = |extra: Value| -> ButtonValue {
            let mut v = json!({"session_id": "s", "request_id": "r", "behavior": "allow"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            serde_json::from_value(v).unwrap()
        };
        let form = json!({"q0": "1", "q1": ["0", "2", "x"], "a1": "words"});
        let Choice::Answers(picked) = value(json!({"form": "answers"})).choice(&form) else {
            panic!("answers")
        };
        assert_eq!(picked.len(), MAX_QUESTIONS);
        assert_eq!(
            (picked[0].options.clone(), picked[0].text.as_str()),
            (vec![1], "")
        );
        assert_eq!(
            (picked[1].options.clone(), picked[1].text.as_str()),
            (vec![0, 2], "words")
        );
        let feedback = value(json!({"form": "feedback"})).choice(&json!({"feedback": "no"}));
        assert_eq!(feedback, Choice::Feedback("no".into()));
        assert_eq!(
            value(json!({"suggestion": 1})).choice(&Value::Null),
            Choice::Suggestion(1)
        );
        assert_eq!(
            value(json!({"mode": "accept_edits"})).choice(&Value::Null),
            Choice::Mode(PlanMode::AcceptEdits)
        );
        assert_eq!(value(json!({})).choice(&Value::Null), Choice::Plain);
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
