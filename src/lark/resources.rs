//! A person's files from Lark (issue 39): what an `image`, `file`,
//! `audio`, `media` or `post` message carries (its text and its resources),
//! and the durable download of those resources ([`Fetcher`]).
//!
//! The event is committed with its turn and a download job
//! (`lark_fetches`) before Lark is acknowledged; the turn keeps its place
//! in the queue and no claim takes it, or any turn behind it, until the job
//! ends. One fetcher per broker runs the due jobs: each resource through
//! LARK.md's resource route with the tenant token, under the reply path's
//! rules ([`super::api`]): a rate limit waits (not a failure), a network
//! error, a 5xx or an unknown code is tried again with backoff up to
//! [`FETCH_ATTEMPTS`] failed attempts, and a JSON error with a code under a
//! 4xx, a final code or a file over the limits fails that file for good. The
//! job ends in one transaction ([`crate::decide::lark::fetched`]): the files
//! stored on the turn, and a line of its text for each that failed, saying
//! which and why. A restart mid-download finds the job and fetches again;
//! files are content-addressed, stored once.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::LarkConfig;
use super::api::{self, Api, Failure};
use crate::attachments::{self, Upload};
use crate::decide::lark::Fetched;
pub use crate::decide::lark::Resource;
use crate::store::{FetchJob, Store};
use crate::time::now_ms;

/// A download job's failed attempts (a rate-limit wait is none) before the
/// files still missing fail for good: its turn holds its session's queue
/// meanwhile, so it gives up within about a minute of backoff.
pub const FETCH_ATTEMPTS: i64 = 6;

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
                    kind: "image".into(),
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
                    kind: "file".into(),
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
                            kind: kind.to_owned(),
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

/// Runs the due download jobs until shutdown; one per broker with a Lark
/// connector. Woken when an event starts a job, and at the next job's due
/// time (or a minute, as a safety net).
pub struct Fetcher {
    store: Arc<dyn Store>,
    api: Api,
    wake: Arc<Notify>,
    shutdown: CancellationToken,
}

impl Fetcher {
    pub fn new(
        store: Arc<dyn Store>,
        config: LarkConfig,
        wake: Arc<Notify>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            store,
            // A file of up to 20 MiB.
            api: Api::new(config, Duration::from_secs(60)),
            wake,
            shutdown,
        }
    }

    pub async fn run(mut self) {
        let wake = self.wake.clone();
        let shutdown = self.shutdown.clone();
        loop {
            let woken = wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let due = match self.store.due_fetches(now_ms(), 8).await {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!(error = %e.message, "could not read the lark download jobs");
                    Vec::new()
                }
            };
            let busy = !due.is_empty();
            for job in due {
                // A hanging Lark never holds up a shutdown: the job stays,
                // handed back (a PostgreSQL lease ended), and runs again
                // after the restart, here or on another replica.
                let turn_id = job.turn_id.clone();
                let failures = job.failures;
                tokio::select! {
                    _ = self.fetch(job) => {}
                    _ = shutdown.cancelled() => {
                        let handed_back = self.store.record_fetch(turn_id, failures, now_ms());
                        let _ = tokio::time::timeout(Duration::from_secs(2), handed_back).await;
                        return;
                    }
                }
            }
            if busy {
                continue;
            }
            let next = self.store.next_fetch_due().await.ok().flatten();
            if !api::until_due(next, woken, &shutdown).await {
                return;
            }
        }
    }

    /// One job: every resource downloaded in order, then the job ended with
    /// the files and the failure lines; or, on a wait or a retry, the job
    /// put off (what was downloaded is downloaded again then).
    async fn fetch(&mut self, job: FetchJob) {
        let resources: Vec<Resource> = serde_json::from_str(&job.resources).unwrap_or_default();
        let mut uploads: Vec<Upload> = Vec::new();
        let mut failures = Vec::new();
        let mut total = 0u64;
        for resource in &resources {
            let position = uploads.len();
            if position >= attachments::MAX_FILES {
                failures.push(failure_line(resource, "a message carries at most 10 files"));
                continue;
            }
            let (bytes, declared, name) = match self.download(&job, resource).await {
                Ok(downloaded) => downloaded,
                Err(Failure::Final(why)) => {
                    failures.push(failure_line(resource, &why));
                    continue;
                }
                Err(Failure::Retry(_, why)) if job.failures + 1 >= FETCH_ATTEMPTS => {
                    failures.push(failure_line(resource, &why));
                    continue;
                }
                Err(Failure::Retry(after, why)) => {
                    tracing::warn!(failures = job.failures + 1, error = %why, "lark download will be retried");
                    return self.put_off(&job, job.failures + 1, after).await;
                }
                Err(Failure::Wait(after, _)) => {
                    tracing::debug!("lark download rate limited, waiting");
                    return self.put_off(&job, job.failures, after).await;
                }
            };
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
                Ok(upload) => uploads.push(upload),
                Err(e) => failures.push(failure_line(resource, &e.message)),
            }
        }
        let ended = async {
            let fetched = Fetched {
                session_id: job.session_id.clone(),
                turn_id: job.turn_id.clone(),
                attachments: uploads.iter().map(|u| u.stored.clone()).collect(),
                failures,
            };
            let blobs = crate::store::blobs(&uploads);
            self.store.lark_fetched(fetched, blobs).await
        };
        if let Err(e) = ended.await {
            tracing::error!(error = %e.message, "could not store a lark message's files");
            let after = self.api.backoff(job.failures);
            self.put_off(&job, job.failures + 1, after).await;
        }
    }

    async fn put_off(&self, job: &FetchJob, failures: i64, after: Duration) {
        let at = now_ms() + after.as_millis() as i64;
        let recorded = self
            .store
            .record_fetch(job.turn_id.clone(), failures, at)
            .await;
        if let Err(e) = recorded {
            tracing::error!(error = %e.message, "could not record a lark download attempt");
        }
    }

    /// One resource's bytes, its declared type and its file name (from
    /// `Content-Disposition`), within the per-file limit as it streams.
    async fn download(
        &mut self,
        job: &FetchJob,
        resource: &Resource,
    ) -> Result<(bytes::Bytes, Option<String>, Option<String>), Failure> {
        let url = format!(
            "{}/open-apis/im/v1/messages/{}/resources/{}",
            self.api.config.base_url,
            urlencode(&job.message_id),
            urlencode(&resource.key)
        );
        let mut refreshed = false;
        loop {
            let token = self.api.token().await?;
            let response = self
                .api
                .http
                .get(&url)
                .query(&[("type", resource.kind.as_str())])
                .bearer_auth(&token)
                .send()
                .await
                .map_err(|e| {
                    self.api.retry(
                        job.failures,
                        format!("the download failed ({})", e.without_url()),
                    )
                })?;
            let status = response.status();
            let header = |name: &str| {
                response
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let declared = header("content-type");
            if status.is_success() && !declared.as_deref().is_some_and(|t| t.contains("json")) {
                let name = header("content-disposition").and_then(|d| disposition_name(&d));
                return self
                    .read_limited(response, job.failures)
                    .await
                    .map(|bytes| (bytes, declared, name));
            }
            let reset = api::reset(&response);
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            let coded = answer.get("code").and_then(Value::as_i64).is_some();
            match self
                .api
                .judge(status, reset, &answer, job.failures, &[], refreshed)
            {
                None => refreshed = true,
                // A resource refused with a code (not there, not this
                // message's, not the app's to read) stays refused.
                Some(Failure::Retry(_, why)) if coded && status.is_client_error() => {
                    return Err(Failure::Final(why));
                }
                Some(failure) => return Err(failure),
            }
        }
    }

    async fn read_limited(
        &self,
        mut response: reqwest::Response,
        failures: i64,
    ) -> Result<bytes::Bytes, Failure> {
        let mut bytes = bytes::BytesMut::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            self.api.retry(
                failures,
                format!("the download broke off ({})", e.without_url()),
            )
        })? {
            bytes.extend_from_slice(&chunk);
            attachments::check_file(bytes.len() as u64)
                .map_err(|e| Failure::Final(e.message.to_string()))?;
        }
        Ok(bytes.freeze())
    }
}

fn failure_line(resource: &Resource, why: &str) -> String {
    let name = resource
        .name
        .as_deref()
        .map(attachments::sanitize_name)
        .unwrap_or_else(|| format!("the {}", resource.kind));
    format!("A file sent from Lark, {name}, could not be fetched: {why}")
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
