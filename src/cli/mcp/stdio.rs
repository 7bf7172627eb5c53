//! The stdio framing in front of rmcp. rmcp drops an unparsable line and an
//! oversized one without an answer (the client's request then hangs) and
//! answers a request whose parameters do not fit as an unknown method. This
//! front reads stdin itself, one bounded line at a time, and answers those as
//! JSON-RPC says: `-32700` for a line that is not JSON, `-32600` for a line
//! over [`MAX_LINE`] (with its id when the line's start names one), `-32602`
//! for a served method whose `params` do not fit. Every other line goes to
//! rmcp unchanged; rmcp's output and these answers share one writer, a whole
//! line at a time. Nothing here logs a line's content.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::{mpsc, watch};

/// The longest line read from stdin (rmcp's own limit).
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// How much of an oversized line is kept to find its id.
const ID_PREFIX: usize = 4096;
/// The pipes between this front and rmcp.
const PIPE: usize = 256 * 1024;

/// JSON-RPC's error codes.
pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const INVALID_PARAMS: i64 = -32602;

/// rmcp's end of the front, and a signal that stdin closed.
pub struct Front {
    /// What rmcp reads (the lines that passed) and writes (its messages).
    pub transport: (DuplexStream, DuplexStream),
    /// Turns true when stdin reaches its end.
    pub stdin_closed: watch::Receiver<bool>,
}

/// Starts the reader of stdin and the writer of stdout.
pub fn start() -> Front {
    let (rmcp_in, feed) = tokio::io::duplex(PIPE);
    let (rmcp_out, drain) = tokio::io::duplex(PIPE);
    let (lines, to_stdout) = mpsc::unbounded_channel::<Vec<u8>>();
    let (closed, stdin_closed) = watch::channel(false);
    tokio::spawn(write_stdout(to_stdout));
    tokio::spawn(forward_rmcp(drain, lines.clone()));
    tokio::spawn(async move {
        read_stdin(tokio::io::stdin(), feed, lines).await;
        let _ = closed.send(true);
    });
    Front {
        transport: (rmcp_in, rmcp_out),
        stdin_closed,
    }
}

/// The one writer of stdout: whole lines, flushed each.
async fn write_stdout(mut lines: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut stdout = tokio::io::stdout();
    while let Some(line) = lines.recv().await {
        if stdout.write_all(&line).await.is_err() || stdout.flush().await.is_err() {
            return;
        }
    }
}

/// rmcp's messages, a line at a time, to the writer.
async fn forward_rmcp(drain: DuplexStream, lines: mpsc::UnboundedSender<Vec<u8>>) {
    let mut drain = BufReader::new(drain);
    loop {
        let mut line = Vec::new();
        match drain.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if lines.send(line).is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads stdin line by line: answers the lines rmcp would mishandle, passes
/// the rest to rmcp. At the end of stdin, rmcp's input ends too.
async fn read_stdin(
    stdin: impl AsyncRead + Unpin,
    mut feed: DuplexStream,
    answers: mpsc::UnboundedSender<Vec<u8>>,
) {
    let mut reader = BufReader::new(stdin);
    loop {
        let line = match read_line(&mut reader).await {
            Line::End => return,
            Line::Oversized(prefix) => {
                tracing::warn!("answered a line over {MAX_LINE} bytes with an error");
                let message = format!("Invalid request: the line is over {MAX_LINE} bytes.");
                send(&answers, error(id_in(&prefix), INVALID_REQUEST, &message));
                continue;
            }
            Line::Whole(line) => line,
        };
        match check(&line) {
            Verdict::Skip => {}
            Verdict::Answer(answer) => send(&answers, answer),
            Verdict::Pass => {
                if feed.write_all(&line).await.is_err() || feed.write_all(b"\n").await.is_err() {
                    return;
                }
            }
        }
    }
}

fn send(answers: &mpsc::UnboundedSender<Vec<u8>>, answer: Value) {
    let mut line = answer.to_string().into_bytes();
    line.push(b'\n');
    let _ = answers.send(line);
}

enum Line {
    /// A line, without its newline.
    Whole(Vec<u8>),
    /// A line over [`MAX_LINE`], dropped: its first bytes.
    Oversized(Vec<u8>),
    End,
}

/// One line, never buffering more than [`MAX_LINE`] bytes of it. A last line
/// without a newline at the end of stdin is still a line.
async fn read_line(reader: &mut (impl tokio::io::AsyncBufRead + Unpin)) -> Line {
    let mut line = Vec::new();
    let mut oversized: Option<Vec<u8>> = None;
    loop {
        let available = match reader.fill_buf().await {
            Ok(available) => available,
            Err(_) => return Line::End,
        };
        if available.is_empty() {
            return match (oversized, line.is_empty()) {
                (Some(prefix), _) => Line::Oversized(prefix),
                (None, true) => Line::End,
                (None, false) => Line::Whole(line),
            };
        }
        let newline = available.iter().position(|b| *b == b'\n');
        let take = newline.map_or(available.len(), |at| at + 1);
        let part = &available[..newline.unwrap_or(take)];
        match &mut oversized {
            Some(_) => {}
            None if line.len() + part.len() > MAX_LINE => {
                line.extend_from_slice(
                    &part[..ID_PREFIX.saturating_sub(line.len()).min(part.len())],
                );
                line.truncate(ID_PREFIX);
                oversized = Some(std::mem::take(&mut line));
            }
            None => line.extend_from_slice(part),
        }
        reader.consume(take);
        if newline.is_some() {
            return match oversized {
                Some(prefix) => Line::Oversized(prefix),
                None => Line::Whole(line),
            };
        }
    }
}

enum Verdict {
    Pass,
    Skip,
    Answer(Value),
}

/// What to do with one line.
fn check(line: &[u8]) -> Verdict {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Verdict::Skip;
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(_) => {
            return Verdict::Answer(error(
                Value::Null,
                PARSE_ERROR,
                "Parse error: the line is not JSON.",
            ));
        }
    };
    let (Some(id), Some(method)) = (value.get("id"), value.get("method").and_then(Value::as_str))
    else {
        return Verdict::Pass;
    };
    match params_problem(method, value.get("params")) {
        Some(problem) => Verdict::Answer(error(
            id.clone(),
            INVALID_PARAMS,
            &format!("Invalid params for {method}: {problem}."),
        )),
        None => Verdict::Pass,
    }
}

/// Why `params` do not fit a method this server serves (`None`: they fit,
/// or the method is not one of them and rmcp answers it).
fn params_problem(method: &str, params: Option<&Value>) -> Option<String> {
    use rmcp::model::{CallToolRequestParams, InitializeRequestParams, PaginatedRequestParams};
    fn fits<T: serde::de::DeserializeOwned>(params: Option<&Value>) -> Option<String> {
        let params = params.cloned().unwrap_or(Value::Null);
        serde_json::from_value::<T>(params)
            .err()
            .map(|e| e.to_string())
    }
    match method {
        "initialize" => fits::<InitializeRequestParams>(params),
        "tools/call" => fits::<CallToolRequestParams>(params),
        "tools/list" => match params {
            None | Some(Value::Null) => None,
            Some(_) => fits::<PaginatedRequestParams>(params),
        },
        "ping" => match params {
            None | Some(Value::Null) | Some(Value::Object(_)) => None,
            Some(_) => Some("params must be an object".into()),
        },
        _ => None,
    }
}

/// A JSON-RPC error answer.
pub fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The `"id"` an oversized line's start names (a number or a string), else
/// null: enough to let the client's pending request end.
fn id_in(prefix: &[u8]) -> Value {
    let text = String::from_utf8_lossy(prefix);
    let Some(at) = text.find("\"id\"") else {
        return Value::Null;
    };
    let rest = text[at + 4..].trim_start();
    let Some(rest) = rest.strip_prefix(':') else {
        return Value::Null;
    };
    let rest = rest.trim_start();
    if let Some(string) = rest.strip_prefix('"') {
        return match string.find('"') {
            Some(end) if !string[..end].contains('\\') => Value::String(string[..end].into()),
            _ => Value::Null,
        };
    }
    let number: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    number
        .parse::<i64>()
        .map(Value::from)
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(line: &str) -> Option<Value> {
        match check(line.as_bytes()) {
            Verdict::Answer(answer) => Some(answer),
            _ => None,
        }
    }

    #[test]
    fn a_line_that_is_not_json_is_a_parse_error_and_a_blank_one_nothing() {
        let parse = answer("{not json").unwrap();
        assert_eq!(parse["error"]["code"], PARSE_ERROR);
        assert_eq!(parse["id"], Value::Null);
        assert!(matches!(check(b"  \r"), Verdict::Skip));
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            Verdict::Pass
        ));
    }

    #[test]
    fn served_methods_with_params_that_do_not_fit_are_invalid_params() {
        let bad = answer(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":5}}"#);
        assert_eq!(bad.unwrap()["error"]["code"], INVALID_PARAMS);
        let bad = answer(
            r#"{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"reply","arguments":"x"}}"#,
        )
        .unwrap();
        assert_eq!(
            (bad["id"].as_str(), bad["error"]["code"].as_i64()),
            (Some("a"), Some(INVALID_PARAMS))
        );
        assert!(answer(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"reply","arguments":{"text":"x"}}}"#).is_none());
        assert!(answer(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).is_none());
        assert!(
            answer(r#"{"jsonrpc":"2.0","id":1,"method":"resources/list","params":5}"#).is_none()
        );
    }

    #[test]
    fn an_oversized_lines_id_is_read_from_its_start() {
        assert_eq!(
            id_in(br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"#),
            json!(42)
        );
        assert_eq!(id_in(br#"{"id" : "req-1", "x"#), json!("req-1"));
        assert_eq!(
            id_in(br#"{"jsonrpc":"2.0","method":"x","params":{"text":"aaaa"#),
            Value::Null
        );
    }

    #[tokio::test]
    async fn lines_are_bounded_and_the_last_one_needs_no_newline() {
        let big = vec![b'a'; MAX_LINE + 10];
        let mut input = br#"{"id":3,"#.to_vec();
        input.extend_from_slice(&big);
        input.extend_from_slice(b"\nnext\nlast");
        let mut reader = BufReader::new(&input[..]);
        let Line::Oversized(prefix) = read_line(&mut reader).await else {
            panic!("an oversized line")
        };
        assert_eq!((prefix.len(), id_in(&prefix)), (ID_PREFIX, json!(3)));
        assert!(matches!(read_line(&mut reader).await, Line::Whole(l) if l == b"next"));
        assert!(matches!(read_line(&mut reader).await, Line::Whole(l) if l == b"last"));
        assert!(matches!(read_line(&mut reader).await, Line::End));
    }
}
