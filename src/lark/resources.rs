//! A person's files from Lark (issue 39): what an `image`, `file`,
//! `audio`, `media` or `post` message carries (its text and its resources),
//! and their download through LARK.md's resource route with the bot's
//! tenant token, each checked against the attachments' limits as it
//! arrives. The downloads run before the event is committed: a redelivery
//! (Lark's, after a restart or a slow download) is the retry, and the
//! event's guard keeps it one turn. A file that cannot be fetched becomes a
//! line of the turn's text saying which and why.

use std::time::Duration;

use serde_json::{Value, json};

use super::LarkConfig;
use crate::attachments::{self, Upload};

/// A resource a message names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub key: String,
    /// `image` for an `image_key`, `file` for everything else (LARK.md).
    pub kind: &'static str,
    pub name: Option<String>,
}

/// A message's text and resources, for the types that carry files; `None`
/// for any other type.
pub fn read(message_type: &str, content: &str) -> Option<(String, Vec<Resource>)> {
    let content: Value = serde_json::from_str(content).ok()?;
    let text = |v: &Value| v.as_str().map(str::to_owned);
    match message_type {
        "image" => {
            let key = text(&content["image_key"])?;
            Some((
                "(an image)".into(),
                vec![Resource {
                    key,
                    kind: "image",
                    name: None,
                }],
            ))
        }
        "file" | "audio" | "media" => {
            let key = text(&content["file_key"])?;
            let name = text(&content["file_name"]);
            let said = match &name {
                Some(name) => format!("(a file: {})", attachments::sanitize_name(name)),
                None => format!("(a {message_type} file)"),
            };
            Some((
                said,
                vec![Resource {
                    key,
                    kind: "file",
                    name,
                }],
            ))
        }
        "post" => Some(read_post(&content)),
        _ => None,
    }
}

/// A `post`: its title, then each paragraph's text elements in order (links
/// as their text and address, mentions by name), and its pictures.
fn read_post(content: &Value) -> (String, Vec<Resource>) {
    // A post may come wrapped in its language (`{"zh_cn": {...}}`).
    let post = if content.get("content").is_some() {
        content
    } else {
        content
            .as_object()
            .and_then(|o| o.values().find(|v| v.get("content").is_some()))
            .unwrap_or(content)
    };
    let mut lines = Vec::new();
    if let Some(title) = post["title"].as_str().filter(|t| !t.trim().is_empty()) {
        lines.push(title.to_owned());
    }
    let mut resources = Vec::new();
    for paragraph in post["content"].as_array().into_iter().flatten() {
        let mut line = String::new();
        for element in paragraph.as_array().into_iter().flatten() {
            let field = |name: &str| element[name].as_str().unwrap_or_default();
            match field("tag") {
                "text" | "md" | "code_block" => line.push_str(field("text")),
                "a" => line.push_str(&format!("{} ({})", field("text"), field("href"))),
                "at" => line.push_str(&format!("@{}", field("user_name"))),
                "img" | "media" => {
                    let (key, kind) = match field("tag") {
                        "img" => (field("image_key"), "image"),
                        _ => (field("file_key"), "file"),
                    };
                    if !key.is_empty() {
                        resources.push(Resource {
                            key: key.to_owned(),
                            kind,
                            name: None,
                        });
                    }
                }
                _ => {}
            }
        }
        if !line.trim().is_empty() {
            lines.push(line);
        }
    }
    let text = match lines.join("\n") {
        text if text.trim().is_empty() => "(a post with pictures)".to_owned(),
        text => text,
    };
    (text, resources)
}

/// What the downloads gave: the files, and a line for each that failed.
#[derive(Debug, Default)]
pub struct Fetched {
    pub uploads: Vec<Upload>,
    pub failures: Vec<String>,
}

/// Downloads each resource of `message_id`, in order. A 5xx or a network
/// failure is tried again twice (after 200 ms, then 400 ms); a JSON error
/// with a code, a file over the limits, or a third failure is final for
/// that file. At most [`attachments::MAX_FILES`] files are taken.
pub async fn fetch(config: &LarkConfig, message_id: &str, resources: &[Resource]) -> Fetched {
    let mut fetched = Fetched::default();
    if resources.is_empty() {
        return fetched;
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap_or_default();
    let token = match tenant_token(&http, config).await {
        Ok(token) => token,
        Err(why) => {
            fetched.failures = resources.iter().map(|r| failure_line(r, &why)).collect();
            return fetched;
        }
    };
    let mut total = 0u64;
    for resource in resources {
        let position = fetched.uploads.len();
        if position >= attachments::MAX_FILES {
            fetched
                .failures
                .push(failure_line(resource, "a message carries at most 10 files"));
            continue;
        }
        match download(&http, config, &token, message_id, resource).await {
            Ok((bytes, declared, name)) => {
                total += bytes.len() as u64;
                let checked = attachments::check_message(position + 1, total).and_then(|()| {
                    Upload::new(
                        position as u32,
                        name.as_deref().or(resource.name.as_deref()),
                        declared.as_deref(),
                        bytes,
                    )
                });
                match checked {
                    Ok(upload) => fetched.uploads.push(upload),
                    Err(e) => fetched.failures.push(failure_line(resource, &e.message)),
                }
            }
            Err(why) => fetched.failures.push(failure_line(resource, &why)),
        }
    }
    fetched
}

fn failure_line(resource: &Resource, why: &str) -> String {
    let name = resource
        .name
        .as_deref()
        .map(attachments::sanitize_name)
        .unwrap_or_else(|| format!("the {}", resource.kind));
    format!("A file sent from Lark, {name}, could not be fetched: {why}")
}

async fn tenant_token(http: &reqwest::Client, config: &LarkConfig) -> Result<String, String> {
    let url = format!(
        "{}/open-apis/auth/v3/tenant_access_token/internal",
        config.base_url
    );
    let answer: Value = http
        .post(&url)
        .json(&json!({"app_id": config.app_id, "app_secret": config.app_secret}))
        .send()
        .await
        .map_err(|e| format!("the token request failed ({})", e.without_url()))?
        .json()
        .await
        .map_err(|_| "the token answer is not JSON".to_owned())?;
    match (
        answer["code"].as_i64(),
        answer["tenant_access_token"].as_str(),
    ) {
        (Some(0), Some(token)) => Ok(token.to_owned()),
        (code, _) => Err(format!("Lark refused the tenant token (code {code:?})")),
    }
}

/// One resource's bytes, its declared type and its file name (from
/// `Content-Disposition`), within the per-file limit as it streams.
async fn download(
    http: &reqwest::Client,
    config: &LarkConfig,
    token: &str,
    message_id: &str,
    resource: &Resource,
) -> Result<(bytes::Bytes, Option<String>, Option<String>), String> {
    let url = format!(
        "{}/open-apis/im/v1/messages/{}/resources/{}",
        config.base_url,
        urlencode(message_id),
        urlencode(&resource.key)
    );
    let mut last = String::new();
    for attempt in 0..3u32 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 << (attempt - 1))).await;
        }
        let response = match http
            .get(&url)
            .query(&[("type", resource.kind)])
            .bearer_auth(token)
            .send()
            .await
        {
            Ok(response) => response,
            Err(e) => {
                last = format!("the download failed ({})", e.without_url());
                continue;
            }
        };
        let status = response.status();
        if status.is_server_error() {
            last = format!("Lark answered HTTP {status}");
            continue;
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let declared = header("content-type");
        if !status.is_success() || declared.as_deref().is_some_and(|t| t.contains("json")) {
            let body: Value = response.json().await.unwrap_or(Value::Null);
            return Err(format!(
                "Lark answered HTTP {status} with code {}",
                body["code"].as_i64().unwrap_or(-1)
            ));
        }
        let name = header("content-disposition").and_then(|d| disposition_name(&d));
        return read_limited(response)
            .await
            .map(|bytes| (bytes, declared, name));
    }
    Err(last)
}

async fn read_limited(mut response: reqwest::Response) -> Result<bytes::Bytes, String> {
    let mut bytes = bytes::BytesMut::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| format!("the download broke off ({})", e.without_url()))?
    {
        bytes.extend_from_slice(&chunk);
        attachments::check_file(bytes.len() as u64).map_err(|e| e.message.to_string())?;
    }
    Ok(bytes.freeze())
}

/// `filename="…"` of a `Content-Disposition` value.
fn disposition_name(value: &str) -> Option<String> {
    let at = value.find("filename=")? + "filename=".len();
    let rest = value[at..].trim_start();
    let name = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split(';').next()?.trim(),
    };
    (!name.is_empty()).then(|| name.to_owned())
}

fn urlencode(part: &str) -> String {
    url::form_urlencoded::byte_serialize(part.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_post_reads_as_its_text_elements_in_order_and_its_pictures() {
        let content = r#"{"title":"Bug","content":[[{"tag":"text","text":"see "},{"tag":"a","text":"log","href":"https://x"}],[{"tag":"img","image_key":"img_1"}],[{"tag":"text","text":"and"},{"tag":"img","image_key":"img_2"}]]}"#;
        let (text, resources) = read("post", content).unwrap();
        assert_eq!(text, "Bug\nsee log (https://x)\nand");
        let keys: Vec<&str> = resources.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["img_1", "img_2"]);
        assert!(resources.iter().all(|r| r.kind == "image"));
        let (text, files) = read("file", r#"{"file_key":"f1","file_name":"../a.pdf"}"#).unwrap();
        assert_eq!(text, "(a file: a.pdf)");
        assert_eq!(files[0].kind, "file");
        assert!(read("text", r#"{"text":"x"}"#).is_none());
        assert_eq!(
            disposition_name("attachment; filename=\"shot.png\"").as_deref(),
            Some("shot.png")
        );
    }
}
